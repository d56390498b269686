//! What a run costs and where it ran, read from `/proc` (Linux):
//!
//! - CPU time of a process ([`process_cpu_ns`], from `/proc/PID/stat`) and,
//!   precisely, of this one ([`self_cpu_ns`]);
//! - resident memory of a process ([`rss_kib`], `/proc/PID/status`);
//! - the whole machine's CPU use ([`SystemCpu`], `/proc/stat`) and from it
//!   the CPU used by *other* processes while a measurement ran
//!   ([`noise_cpu_pct`]);
//! - facts about the machine ([`machine_info`]) and the commit measured
//!   ([`tensorwire_commit`]).
//!
//! The parsers are separate functions ([`parse_stat_cpu_ticks`],
//! [`parse_status_rss_kib`], [`SystemCpu::parse`]) so they are tested on
//! canned text; malformed text gives an error, never a panic.

use crate::caller::BenchError;
use crate::results::MachineInfo;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Clock ticks per second of `/proc` CPU figures (`sysconf(_SC_CLK_TCK)`,
/// 100 on Linux).
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// Converts clock ticks to nanoseconds.
fn ticks_to_ns(ticks: u64) -> u64 {
    let ns = u128::from(ticks) * 1_000_000_000 / u128::from(clock_ticks_per_second());
    u64::try_from(ns).unwrap_or(u64::MAX)
}

fn read_proc(path: &str) -> Result<String, BenchError> {
    std::fs::read_to_string(path).map_err(|e| BenchError::new(format!("{path}: {e}")))
}

/// `utime + stime` in clock ticks from the text of a `/proc/PID/stat`.
///
/// The command name (field 2) is in parentheses and may itself hold spaces
/// and parentheses, so the fields are counted from after the **last** `)`:
/// there, field 3 (state) is the first, and utime and stime (fields 14 and
/// 15) are the 12th and 13th.
pub fn parse_stat_cpu_ticks(stat: &str) -> Result<u64, BenchError> {
    let (_, rest) = stat
        .rsplit_once(')')
        .ok_or_else(|| BenchError::new("malformed /proc stat: no `)` after the command name"))?;
    let mut fields = rest.split_whitespace().skip(11);
    let mut next = |name: &str| -> Result<u64, BenchError> {
        let f = fields
            .next()
            .ok_or_else(|| BenchError::new(format!("malformed /proc stat: no {name} field")))?;
        f.parse::<u64>()
            .map_err(|_| BenchError::new(format!("malformed /proc stat: {name} `{f}`")))
    };
    let utime = next("utime")?;
    let stime = next("stime")?;
    Ok(utime.saturating_add(stime))
}

/// CPU time (user + system) process `pid` has used, in nanoseconds, from
/// `/proc/PID/stat`. Its resolution is one clock tick (10 ms).
pub fn process_cpu_ns(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let text = read_proc(&path)?;
    let ticks = parse_stat_cpu_ticks(&text).map_err(|e| BenchError::new(format!("{path}: {e}")))?;
    Ok(ticks_to_ns(ticks))
}

/// CPU time (user + system) of this process's children that have exited and
/// been waited for (`cutime + cstime` of `/proc/self/stat`), in nanoseconds.
/// A child reaped during a measurement (the raw floors' echo peer) adds its
/// whole CPU time here.
pub fn reaped_children_cpu_ns() -> Result<u64, BenchError> {
    let text = read_proc("/proc/self/stat")?;
    let (_, rest) = text
        .rsplit_once(')')
        .ok_or_else(|| BenchError::new("malformed /proc/self/stat"))?;
    let ticks: u64 = rest
        .split_whitespace()
        .skip(13)
        .take(2)
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    Ok(ticks_to_ns(ticks))
}

/// CPU time (user + system, all threads) this process has used, in
/// nanoseconds, from `clock_gettime(CLOCK_PROCESS_CPUTIME_ID)`: precise,
/// not rounded to ticks.
pub fn self_cpu_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `VmRSS` in KiB from the text of a `/proc/PID/status`.
pub fn parse_status_rss_kib(status: &str) -> Result<u64, BenchError> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or_else(|| BenchError::new("no VmRSS line (a kernel thread or a zombie?)"))?;
    let mut parts = line.split_whitespace();
    let value = parts
        .next()
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| BenchError::new(format!("malformed VmRSS line `{}`", line.trim())))?;
    match parts.next() {
        Some("kB") | None => Ok(value),
        Some(unit) => Err(BenchError::new(format!("unexpected VmRSS unit `{unit}`"))),
    }
}

/// Resident set size of process `pid` in KiB (`VmRSS` of
/// `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Result<u64, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = read_proc(&path)?;
    parse_status_rss_kib(&text).map_err(|e| BenchError::new(format!("{path}: {e}")))
}

/// A snapshot of the machine's CPU time, all CPUs together (the first,
/// `cpu`, line of `/proc/stat`), in nanoseconds of CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SystemCpu {
    busy_ns: u64,
    total_ns: u64,
}

impl SystemCpu {
    /// Reads `/proc/stat` now.
    pub fn snapshot() -> Result<SystemCpu, BenchError> {
        let text = read_proc("/proc/stat")?;
        SystemCpu::parse(&text).map_err(|e| BenchError::new(format!("/proc/stat: {e}")))
    }

    /// Parses the text of `/proc/stat` (only its `cpu ` line is read).
    ///
    /// Busy = user + nice + system + irq + softirq + steal; total = busy +
    /// idle + iowait. (`guest` time is already inside `user`, so it is not
    /// added again.) Lines with fewer than the first eight figures are an
    /// error.
    pub fn parse(stat: &str) -> Result<SystemCpu, BenchError> {
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some("cpu"))
            .ok_or_else(|| BenchError::new("no `cpu` line"))?;
        let mut v = [0u64; 8];
        let mut it = line.split_whitespace().skip(1);
        for (i, slot) in v.iter_mut().enumerate() {
            let f = it
                .next()
                .ok_or_else(|| BenchError::new(format!("`cpu` line has only {i} figures")))?;
            *slot = f
                .parse()
                .map_err(|_| BenchError::new(format!("malformed `cpu` figure `{f}`")))?;
        }
        let [user, nice, system, idle, iowait, irq, softirq, steal] = v;
        let busy = [user, nice, system, irq, softirq, steal]
            .iter()
            .fold(0u64, |a, &b| a.saturating_add(b));
        let total = busy.saturating_add(idle).saturating_add(iowait);
        Ok(SystemCpu {
            busy_ns: ticks_to_ns(busy),
            total_ns: ticks_to_ns(total),
        })
    }

    /// CPU time spent busy (user, nice, system, irq, softirq, steal) on all
    /// CPUs since boot, ns.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// All CPU time (busy, idle and iowait) on all CPUs since boot, ns.
    pub fn total_ns(&self) -> u64 {
        self.total_ns
    }
}

/// CPU used by everything other than the measured processes between two
/// snapshots, in percent of one core: `(busy delta − own_cpu_ns) / elapsed
/// × 100`, never below 0. `own_cpu_ns` is the CPU time of the processes
/// being measured (the harness itself and the target's server) over the
/// same interval.
///
/// `/proc/stat` counts in clock ticks (10 ms per CPU), so the figure is
/// coarse for short measurements: over 100 ms, one tick is 10 % of a core.
/// Returns 0 when `elapsed` is zero.
pub fn noise_cpu_pct(
    before: &SystemCpu,
    after: &SystemCpu,
    own_cpu_ns: u64,
    elapsed: Duration,
) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    let busy = after.busy_ns.saturating_sub(before.busy_ns) as f64;
    let other = busy - own_cpu_ns as f64;
    (other / 1e9 / secs * 100.0).max(0.0)
}

/// The value of the first `key: value` line of `text` (`/proc/cpuinfo`,
/// `/proc/meminfo` style), trimmed.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The CPU model from the text of `/proc/cpuinfo` (`model name`, or on
/// some ARM kernels `Hardware`/`Processor`/`cpu model`).
pub fn parse_cpu_model(cpuinfo: &str) -> Option<String> {
    ["model name", "Hardware", "Processor", "cpu model"]
        .iter()
        .find_map(|k| field(cpuinfo, k).filter(|v| !v.is_empty()))
        .map(str::to_string)
}

/// `MemTotal` in KiB from the text of `/proc/meminfo`.
pub fn parse_mem_total_kib(meminfo: &str) -> Option<u64> {
    field(meminfo, "MemTotal")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The number of CPUs in a CPU list like `/sys/devices/system/cpu/online`
/// (`0-3,6,8-9` → 7).
pub fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.trim().split(',') {
        let part = part.trim();
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)? + 1)?;
    }
    (n > 0).then_some(n)
}

/// Facts about this machine: CPU model (`unknown` when not found), online
/// CPUs, total memory (0 when unreadable), kernel release and host name
/// (from `uname`).
pub fn machine_info() -> MachineInfo {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cpus = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| parse_cpu_list(&s))
        .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
        .unwrap_or(1);
    let uname = rustix::system::uname();
    MachineInfo {
        cpu_model: parse_cpu_model(&cpuinfo).unwrap_or_else(|| "unknown".to_string()),
        cpus,
        mem_kib: parse_mem_total_kib(&meminfo).unwrap_or(0),
        kernel: uname.release().to_string_lossy().into_owned(),
        hostname: uname.nodename().to_string_lossy().into_owned(),
    }
}

/// Runs `git -C repo ARGS` and returns its standard output, or `None` when
/// git is missing or fails.
fn git(repo: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        // Do not take the index lock (others may be using the work tree).
        .env("GIT_OPTIONAL_LOCKS", "0")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// The commit of the repository at `repo` (`git rev-parse HEAD`), with
/// `+dirty` appended when `git status --porcelain` lists anything (changed
/// or untracked files); `unknown` when git fails (not a repository, git
/// missing).
pub fn tensorwire_commit(repo: &Path) -> String {
    let Some(head) = git(repo, &["rev-parse", "HEAD"]) else {
        return "unknown".to_string();
    };
    let head = head.trim();
    if head.is_empty() {
        return "unknown".to_string();
    }
    match git(repo, &["status", "--porcelain"]) {
        Some(s) if !s.trim().is_empty() => format!("{head}+dirty"),
        _ => head.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_grows_after_a_busy_loop() {
        let a = self_cpu_ns();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let b = self_cpu_ns();
        // At least a third of the 30 ms even on a shared machine.
        assert!(b > a + 10_000_000, "{a} -> {b}");
        // /proc counts whole ticks (and other test threads run meanwhile).
        let p = process_cpu_ns(std::process::id()).unwrap();
        assert!(p > 0);
    }

    #[test]
    fn own_rss_is_positive() {
        let kib = rss_kib(std::process::id()).unwrap();
        assert!(kib > 0);
        assert!(rss_kib(u32::MAX).is_err());
        assert!(process_cpu_ns(u32::MAX).is_err());
    }

    #[test]
    fn parses_stat_lines() {
        let tail = "S 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0 100 200 300";
        assert_eq!(
            parse_stat_cpu_ticks(&format!("42 (cat) {tail}")).unwrap(),
            280
        );
        // A command name with spaces and parentheses.
        assert_eq!(
            parse_stat_cpu_ticks(&format!("42 ((a b) c)) {tail}")).unwrap(),
            280
        );
        assert_eq!(
            parse_stat_cpu_ticks(&format!("42 (a b) c) {tail}")).unwrap(),
            280
        );
        for bad in [
            "",
            "42 cat S 1 2 3",
            "42 (cat) S 1 2 3",
            "42 (cat) S 1 2 3 4 5 6 7 8 9 10 x 30",
            "42 (cat) S 1 2 3 4 5 6 7 8 9 10 250 -1",
        ] {
            assert!(parse_stat_cpu_ticks(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn parses_status() {
        let s = "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads: 1\n";
        assert_eq!(parse_status_rss_kib(s).unwrap(), 1234);
        assert!(parse_status_rss_kib("Name: x\n").is_err());
        assert!(parse_status_rss_kib("VmRSS: lots kB\n").is_err());
        assert!(parse_status_rss_kib("VmRSS: 12 MB\n").is_err());
    }

    #[test]
    fn parses_proc_stat_and_noise() {
        let hz = clock_ticks_per_second();
        let before = SystemCpu::parse(
            "cpu  100 10 50 1000 5 1 2 3 0 0\ncpu0 50 5 25 500 2 0 1 1 0 0\nintr 1 2\n",
        )
        .unwrap();
        assert_eq!(before.busy_ns(), ticks_to_ns(166));
        assert_eq!(before.total_ns(), ticks_to_ns(1171));
        // One second later: 150 ticks more busy (1.5 cores' worth at 100 Hz).
        let after = SystemCpu::parse("cpu  200 10 100 1100 5 1 2 3\n").unwrap();
        let busy = ticks_to_ns(150);
        assert_eq!(after.busy_ns() - before.busy_ns(), busy);
        let one_s = Duration::from_secs(1);
        let pct = noise_cpu_pct(&before, &after, 0, one_s);
        assert!((pct - busy as f64 / 1e7).abs() < 1e-9, "{pct}");
        if hz == 100 {
            assert!((pct - 150.0).abs() < 1e-9);
            // Half a core of it was ours.
            let pct = noise_cpu_pct(&before, &after, 500_000_000, one_s);
            assert!((pct - 100.0).abs() < 1e-9, "{pct}");
        }
        // More own CPU than the machine counted (tick rounding): clamped.
        assert_eq!(noise_cpu_pct(&before, &after, u64::MAX, one_s), 0.0);
        assert_eq!(noise_cpu_pct(&after, &before, 0, one_s), 0.0);
        assert_eq!(noise_cpu_pct(&before, &after, 0, Duration::ZERO), 0.0);
        for bad in [
            "",
            "cpu0 1 2 3 4 5 6 7 8\n",
            "cpu 1 2 3\n",
            "cpu 1 2 x 4 5 6 7 8\n",
        ] {
            assert!(SystemCpu::parse(bad).is_err(), "{bad:?}");
        }
        let now = SystemCpu::snapshot().unwrap();
        assert!(now.total_ns() >= now.busy_ns() && now.total_ns() > 0);
    }

    #[test]
    fn machine_facts() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Example CPU @ 3.00GHz\nflags: a b\n";
        assert_eq!(
            parse_cpu_model(cpuinfo).as_deref(),
            Some("Example CPU @ 3.00GHz")
        );
        assert_eq!(
            parse_cpu_model("Hardware: BCM2711\n").as_deref(),
            Some("BCM2711")
        );
        assert_eq!(parse_cpu_model("flags: a\n"), None);
        assert_eq!(
            parse_mem_total_kib("MemTotal:       16318480 kB\nMemFree: 1 kB\n"),
            Some(16_318_480)
        );
        assert_eq!(parse_mem_total_kib("MemTotal: x kB\n"), None);
        assert_eq!(parse_cpu_list("0-3,6,8-9\n"), Some(7));
        assert_eq!(parse_cpu_list("0\n"), Some(1));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        let m = machine_info();
        assert!(m.cpus >= 1);
        assert!(m.mem_kib > 0);
        assert!(!m.kernel.is_empty());
        assert!(!m.cpu_model.is_empty());
    }

    #[test]
    fn commit_of_a_non_repository_is_unknown() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(tensorwire_commit(dir.path()), "unknown");
        let here = tensorwire_commit(Path::new(env!("CARGO_MANIFEST_DIR")));
        assert!(!here.is_empty());
    }
}
