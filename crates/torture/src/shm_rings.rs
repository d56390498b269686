//! Hostile shared-memory clients that break the words they share with the
//! agent, beside the ones of [`crate::scenarios::shm_hostile`] (scribbled
//! arenas, unread rings, half Hellos): one row per attack kind.
//!
//! - **ring indices**: a client rewinds and advances the indices it owns —
//!   the `tail` of its response ring (to random values, just behind and
//!   just ahead of what the agent published, to u64/u32 extremes, back to
//!   0 after progress) while the agent has answers to publish, the marks
//!   of its request ring (a lap behind, a lap ahead, extremes, a slot
//!   skipped), and the request ring's `tail` that only the agent writes;
//! - **sleep words**: a client sets a sleep word and holds it (rewriting it
//!   whenever it changes) while it sends requests and polls for the
//!   answers: its own word, telling the agent it sleeps when it does not
//!   (futex, parked on the control socket, garbage), and the agent's word
//!   (0, futex, parked, garbage), which the agent sleeps on.
//!
//! After each attack the client sends a valid request: the agent may serve
//! it or have dropped the session, both fine. The defects: the agent dies,
//! the observer beside it (over shm) sees an error, a session's
//! descriptors stay behind, or the agent keeps a core busy — measured as
//! the agent's CPU time per second while the words are held, and in a
//! quiet window after the attackers left, against one before the attack.

use crate::agent::AgentUnderTest;
use crate::scenarios::{identity_id, scenario, Tried, HANG_LIMIT};
use crate::{Config, ScenarioResult, TortureError};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use transport::shm::layout::{AGENT_SLEEP, CLIENT_SLEEP};
use transport::shm::{
    control_path, futex, ShmChannel, ShmError, SLEEP_FUTEX, SLEEP_PARKED, SLOT_LEN,
};
use wire::{Kind, Limits};

/// Offsets inside a ring (see `transport::shm::ring`).
const RING_TAIL: usize = 64;
const RING_SLOTS: usize = 128;
/// The mark: the last word of a message's first slot.
const MARK: usize = SLOT_LEN - 8;

/// How long a client waits for the answer to its check request.
const CHECK_WAIT: Duration = Duration::from_millis(100);

/// More agent CPU than this (cores, over the quiet baseline) is a core
/// kept busy.
const BUSY_CORES: f64 = 0.5;

/// The two rows: ring indices, then sleep words.
pub fn attack(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    out: &mut dyn FnMut(ScenarioResult),
) -> Result<(), TortureError> {
    out(run(
        agent,
        cfg,
        "shm ring indices broken",
        RING_ATTACKS.len(),
    )?);
    out(run(
        agent,
        cfg,
        "shm sleep words held",
        SLEEP_ATTACKS.len(),
    )?);
    Ok(())
}

/// A hostile client: its channel and what it has published so far.
struct Hostile {
    ch: ShmChannel,
    identity: u32,
    /// Slots its request ring's producer has used.
    sent_slots: u64,
    next_id: u64,
}

impl Hostile {
    fn connect(path: &std::path::Path, identity: u32) -> Result<Hostile, ShmError> {
        let (ch, _) = ShmChannel::connect(path, &Limits::default(), None, 1, HANG_LIMIT)?;
        Ok(Hostile {
            ch,
            identity,
            sent_slots: 0,
            next_id: 2,
        })
    }

    /// Publishes one valid request; false when the ring is full (or broken).
    fn send(&mut self) -> bool {
        let (h, desc) = crate::hostile::u8_request(self.identity, self.next_id, 0);
        self.next_id += 1;
        match self.ch.send(&h, &desc) {
            Ok(true) => {
                self.sent_slots += 1 + desc.len().div_ceil(SLOT_LEN) as u64;
                true
            }
            _ => false,
        }
    }

    /// Publishes requests until the ring is full (at most 10 000).
    fn flood(&mut self) {
        for _ in 0..10_000 {
            if !self.send() {
                return;
            }
        }
    }

    fn ring_word(&self, ring: usize, offset: usize) -> &AtomicU64 {
        self.ch.arena().atomic_u64(ring + offset)
    }

    fn capacity(&self) -> u64 {
        u64::from(self.ch.layout().ring_capacity)
    }

    /// Slot `i`'s mark word in the ring at `ring`.
    fn mark(&self, ring: usize, i: u64) -> &AtomicU64 {
        let slot = (i % self.capacity()) as usize;
        self.ring_word(ring, RING_SLOTS + slot * SLOT_LEN + MARK)
    }

    /// The highest mark the agent published in the response ring: how
    /// far it got.
    fn agent_head(&self) -> u64 {
        let ring = self.ch.layout().response_ring;
        (0..self.capacity())
            .map(|i| self.mark(ring, i).load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// Writes a valid request header into the request ring's slot `at`
    /// with mark `mark` (which the agent must not take unless it is the
    /// one it expects there).
    fn forge(&self, at: u64, mark: u64) {
        let (h, _) = crate::hostile::u8_request(self.identity, 1, 0);
        let ring = self.ch.layout().request_ring;
        let slot = (at % self.capacity()) as usize;
        let head = h.encode();
        for (w, chunk) in head[..MARK].chunks_exact(8).enumerate() {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            self.ring_word(ring, RING_SLOTS + slot * SLOT_LEN + w * 8)
                .store(u64::from_ne_bytes(b), Ordering::Relaxed);
        }
        self.mark(ring, at).store(mark, Ordering::Release);
    }

    /// Wakes the agent as a real send would.
    fn wake_agent(&self) {
        let w = self.ch.arena().atomic_u32(AGENT_SLEEP);
        w.store(0, Ordering::SeqCst);
        let _ = futex::wake(w, 1);
    }

    /// A valid request and its answer: `served`, or how it failed.
    fn check(&mut self) -> &'static str {
        if !self.send() {
            return "could not send";
        }
        let deadline = Instant::now() + CHECK_WAIT;
        loop {
            match self.ch.try_recv(&Limits::default()) {
                Ok(Some((h, _))) if h.kind == Kind::Response => return "served",
                // Answers to the flood, or errors: read on.
                Ok(Some(_)) => {}
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Ok(None) => {
                    return if self.ch.peer_alive() {
                        "unanswered (session kept)"
                    } else {
                        "session closed"
                    }
                }
                Err(_) => return "session closed or broken",
            }
        }
    }
}

/// A ring attack: what it does to a fresh client's rings.
type RingAttack = (&'static str, fn(&mut Hostile, &mut fastrand::Rng));

const RING_ATTACKS: [RingAttack; 12] = [
    ("response tail random", |c, rng| {
        c.flood();
        set_response_tail(c, rng.u64(..));
    }),
    ("response tail just ahead", |c, _| {
        c.flood();
        let head = c.agent_head();
        set_response_tail(c, head + 1);
    }),
    ("response tail just behind", |c, _| {
        c.flood();
        let head = c.agent_head();
        set_response_tail(c, head.wrapping_sub(c.capacity() + 1));
    }),
    ("response tail u64 max", |c, _| {
        c.flood();
        set_response_tail(c, u64::MAX);
    }),
    ("response tail u32 max", |c, _| {
        c.flood();
        set_response_tail(c, u64::from(u32::MAX));
    }),
    ("response tail rewound to 0", |c, _| {
        // Progress first: some answers read and given back.
        for _ in 0..4 {
            c.check();
        }
        c.flood();
        set_response_tail(c, 0);
    }),
    ("request mark a lap behind", |c, _| {
        let at = c.sent_slots;
        c.forge(at, at.wrapping_add(1).wrapping_sub(c.capacity()));
        c.wake_agent();
    }),
    ("request mark a lap ahead", |c, _| {
        let at = c.sent_slots;
        c.forge(at, at + 1 + c.capacity());
        c.wake_agent();
    }),
    ("request mark u64 max", |c, _| {
        let at = c.sent_slots;
        c.forge(at, u64::MAX);
        c.wake_agent();
    }),
    ("request mark u32 max", |c, _| {
        let at = c.sent_slots;
        c.forge(at, u64::from(u32::MAX));
        c.wake_agent();
    }),
    ("request slot skipped", |c, _| {
        // A valid mark for a slot past the one the agent expects.
        let at = c.sent_slots + 3;
        c.forge(at, at + 1);
        c.wake_agent();
    }),
    ("request tail (the agent's) random", |c, rng| {
        let ring = c.ch.layout().request_ring;
        c.ring_word(ring, RING_TAIL)
            .store(rng.u64(..), Ordering::Release);
        c.wake_agent();
    }),
];

fn set_response_tail(c: &Hostile, v: u64) {
    let ring = c.ch.layout().response_ring;
    c.ring_word(ring, RING_TAIL).store(v, Ordering::Release);
    c.wake_agent();
}

/// A sleep-word attack: which word, held at what.
type SleepAttack = (&'static str, usize, u32);

const SLEEP_ATTACKS: [SleepAttack; 7] = [
    ("own word held at futex", CLIENT_SLEEP, SLEEP_FUTEX),
    ("own word held at parked", CLIENT_SLEEP, SLEEP_PARKED),
    ("own word held at garbage", CLIENT_SLEEP, 0xdead_beef),
    ("agent's word held at 0", AGENT_SLEEP, 0),
    ("agent's word held at futex", AGENT_SLEEP, SLEEP_FUTEX),
    ("agent's word held at parked", AGENT_SLEEP, SLEEP_PARKED),
    ("agent's word held at garbage", AGENT_SLEEP, u32::MAX),
];

/// Holds `word` at `value` (rewriting it whenever it changes) while the
/// client sends a request at a time and polls for its answer, for `hold`.
fn hold_word(c: &mut Hostile, word: usize, value: u32, hold: Duration) -> (u64, u64) {
    let stop = AtomicBool::new(false);
    let arena = c.ch.arena().clone();
    let w: &AtomicU32 = arena.atomic_u32(word);
    w.store(value, Ordering::SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if w.load(Ordering::Relaxed) != value {
                    w.store(value, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_micros(20));
            }
        });
        let (mut served, mut other) = (0u64, 0u64);
        let end = Instant::now() + hold;
        while Instant::now() < end {
            match c.check() {
                "served" => served += 1,
                _ => other += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        (served, other)
    })
}

/// The agent's CPU use over `window`, in cores.
fn cores_used(agent: &AgentUnderTest, window: Duration) -> f64 {
    let c0 = agent.cpu_time();
    std::thread::sleep(window);
    (agent.cpu_time() - c0).as_secs_f64() / window.as_secs_f64()
}

/// `cfg.shm_rounds` hostile clients one after another, each running the
/// next attack of the row's list (`kinds` of them); the last one, still
/// connected, also holds a word for the whole busy check.
fn run(
    agent: &mut AgentUnderTest,
    cfg: &Config,
    name: &'static str,
    kinds: usize,
) -> Result<ScenarioResult, TortureError> {
    let uri = agent.uri("shm").to_string();
    let shm_name = uri.trim_start_matches("shm://").to_string();
    let path = control_path(&shm_name).map_err(|e| TortureError(format!("{uri}: {e}")))?;
    let identity = identity_id(&uri)?;
    let rounds = cfg.shm_rounds;
    // Long enough for a session thread to spin through its budget and
    // sleep (or not) many times over.
    let hold = if cfg.quick {
        Duration::from_millis(30)
    } else {
        Duration::from_millis(200)
    };
    let quiet = if cfg.quick {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(1000)
    };
    scenario(agent, cfg, name, "shm", move |agent| {
        let baseline = cores_used(agent, quiet);
        let mut rng = fastrand::Rng::with_seed(0x51ee9);
        let mut outcomes: std::collections::BTreeMap<&'static str, u64> = Default::default();
        let (mut failed, mut held, mut held_cpu) = (0u64, Duration::ZERO, Duration::ZERO);
        let mut busiest: (f64, &'static str) = (0.0, "");
        for round in 0..rounds {
            let Ok(mut c) = Hostile::connect(&path, identity) else {
                failed += 1;
                continue;
            };
            let kind = round as usize % kinds;
            if name.contains("ring") {
                let (what, act) = RING_ATTACKS[kind];
                act(&mut c, &mut rng);
                std::thread::sleep(Duration::from_millis(2));
                let o = c.check();
                *outcomes.entry(o).or_default() += 1;
                if o == "served" && what.starts_with("request") {
                    // The forged slot is the agent's to ignore; the real
                    // request after it still came back.
                    *outcomes.entry("served after a forged slot").or_default() += 1;
                }
            } else {
                let (what, word, value) = SLEEP_ATTACKS[kind];
                let c0 = agent.cpu_time();
                let t0 = Instant::now();
                let (served, other) = hold_word(&mut c, word, value, hold);
                let (dt, dc) = (t0.elapsed(), agent.cpu_time() - c0);
                held += dt;
                held_cpu += dc;
                let rate = dc.as_secs_f64() / dt.as_secs_f64();
                if rate > busiest.0 {
                    busiest = (rate, what);
                }
                *outcomes.entry("served while held").or_default() += served;
                *outcomes.entry("not served while held").or_default() += other;
            }
            drop(c);
        }
        // The sessions are gone: the agent must be as quiet as before.
        std::thread::sleep(Duration::from_millis(300));
        let after = cores_used(agent, quiet);
        let mut defects = 0;
        let mut notes = vec![format!(
            "{rounds} clients, {kinds} kinds in turn; {}; {failed} could not connect",
            outcomes
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )];
        if !held.is_zero() {
            let rate = held_cpu.as_secs_f64() / held.as_secs_f64();
            notes.push(format!(
                "agent CPU while words were held {rate:.2} cores (busiest: {} at {:.2})",
                busiest.1, busiest.0
            ));
            if rate > baseline + BUSY_CORES {
                defects += 1;
                notes.push("a held sleep word kept an agent core busy".into());
            }
        }
        notes.push(format!(
            "agent CPU before {baseline:.2} cores, after the attackers left {after:.2}"
        ));
        if after > baseline + BUSY_CORES {
            defects += 1;
            notes.push("the agent kept a core busy after the attackers left".into());
        }
        Tried {
            count: rounds,
            defects,
            notes,
        }
    })
}
