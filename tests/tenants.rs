//! Tenants (issue 16) against real agents on real sockets and shared
//! memory: who a session is (token, uid), what it may list and call, its
//! quotas, SIGHUP reloads, bad tenants files, owner-only sockets, and
//! listeners beyond loopback refused without `--insecure`.

use client::{Client, ClientError, ClientOptions, TensorRef};
use common::{run_bin, shm_dir, tensorwire_command, ServeProcess, TestAgent};
use engine::{Backend, EngineError, Output, OutputData, TensorView};
use server::tenants::digest;
use server::{AgentConfig, ModelRegistry};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wire::{DType, ModelSignature};

const LIMIT: Duration = Duration::from_secs(60);

fn hex(token: &str) -> String {
    digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn with_token(uri: &str, token: Option<&str>) -> Result<Client, ClientError> {
    Client::connect_with(
        uri,
        ClientOptions {
            token: token.map(str::to_string),
            ..ClientOptions::default()
        },
    )
}

fn identity_call(c: &Client) -> Result<(), ClientError> {
    let m = c.model("identity")?;
    let data = [1u8, 2, 3];
    let r = m.infer(&[TensorRef::new(DType::U8, &[3], &data).expect("tensor")])?;
    assert_eq!(r.outputs[0].bytes(), data);
    Ok(())
}

fn model_names(c: &Client) -> Vec<String> {
    let mut n: Vec<String> = c
        .models()
        .expect("list models")
        .into_iter()
        .map(|m| m.signature.name)
        .collect();
    n.sort();
    n
}

fn write_tenants(dir: &Path, text: &str) -> String {
    let p = dir.join("tenants.toml");
    std::fs::write(&p, text).expect("write tenants file");
    p.to_str().expect("utf-8 path").to_string()
}

/// Two tenants by token (each its own model), one by this process's uid.
fn two_tenants(my_uid_models: &str) -> String {
    let uid = my_uid();
    format!(
        "[[tenant]]\nname = \"alpha\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n\n\
         [[tenant]]\nname = \"beta\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"digits\"]\n\n\
         [[tenant]]\nname = \"local\"\nuids = [{uid}]\nmodels = [{my_uid_models}]\n",
        hex("token-a"),
        hex("token-b"),
    )
}

/// This process's uid.
fn my_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("/proc/self")
}

#[test]
fn tokens_and_uids_choose_what_a_session_sees_and_calls_on_every_transport() {
    shm_dir();
    let dir = tempfile::tempdir().expect("tmp");
    let tenants = write_tenants(dir.path(), &two_tenants(""));
    let digits = format!("digits={}", common::digits_model().display());
    let shm = format!("shm://tw-tenants-{}", std::process::id());
    let agent = ServeProcess::spawn(&[
        "--tenants",
        &tenants,
        "--model",
        &digits,
        "--listen",
        "tcp://127.0.0.1:0",
        "--listen",
        &shm,
    ]);
    for uri in &agent.uris {
        // alpha: identity only.
        let a = with_token(uri, Some("token-a")).expect("alpha connects");
        assert_eq!(model_names(&a), ["identity"], "{uri}");
        identity_call(&a).unwrap_or_else(|e| panic!("{uri}: alpha identity: {e}"));
        match a.model("digits") {
            Err(ClientError::PermissionDenied(m)) => {
                assert!(m.contains("'alpha'") && m.contains("'digits'"), "{m}")
            }
            other => panic!("{uri}: alpha looked digits up: {other:?}"),
        }
        // beta: digits only.
        let b = with_token(uri, Some("token-b")).expect("beta connects");
        assert_eq!(model_names(&b), ["digits"], "{uri}");
        match identity_call(&b) {
            Err(ClientError::PermissionDenied(m)) => assert!(m.contains("'beta'"), "{m}"),
            other => panic!("{uri}: beta called identity: {other:?}"),
        }
        // No token: over unix and shm this uid's tenant (no models here);
        // over tcp the default tenant (none in the file: nothing).
        let none = with_token(uri, None).expect("no token connects");
        assert!(model_names(&none).is_empty(), "{uri}");
        assert!(matches!(
            identity_call(&none),
            Err(ClientError::PermissionDenied(_))
        ));
        // A token no tenant lists ends the session at its Hello.
        match with_token(uri, Some("nobody's")) {
            Err(ClientError::PermissionDenied(m)) => {
                assert!(m.contains("not one the agent accepts"), "{m}")
            }
            Err(e) => panic!("{uri}: unknown token: {e}"),
            Ok(_) => panic!("{uri}: unknown token accepted"),
        }
        // ... and the others go on.
        identity_call(&a).unwrap_or_else(|e| panic!("{uri}: alpha after refusals: {e}"));
    }
}

#[test]
fn a_local_peer_without_token_is_its_uid_s_tenant() {
    let dir = tempfile::tempdir().expect("tmp");
    let tenants = write_tenants(dir.path(), &two_tenants("\"identity\""));
    let digits = format!("digits={}", common::digits_model().display());
    let agent = ServeProcess::spawn(&["--tenants", &tenants, "--model", &digits]);
    let c = with_token(&agent.uris[0], None).expect("connect");
    assert_eq!(model_names(&c), ["identity"]);
    identity_call(&c).expect("this uid may call identity");
    // `tensorwire models` with TENSORWIRE_TOKEN set speaks for beta.
    let out = tensorwire_command()
        .args(["models", "--connect", &agent.uris[0]])
        .env("TENSORWIRE_TOKEN", "token-b")
        .output()
        .expect("run models");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("digits") && !text.contains("identity"),
        "{text}"
    );
}

/// Identity, slowly: holds each request `delay` in the engine.
struct Slow {
    sig: ModelSignature,
    delay: Duration,
}

impl Backend for Slow {
    fn signature(&self) -> &ModelSignature {
        &self.sig
    }
    fn check_inputs(&self, _: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }
    fn run(&self, inputs: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        std::thread::sleep(self.delay);
        Ok((0..inputs.len())
            .map(|i| Output {
                dtype: inputs[i].dtype,
                shape: inputs[i].shape.to_vec(),
                data: OutputData::Input(i),
            })
            .collect())
    }
}

fn quota_agent(tenants_text: &str) -> (TestAgent, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("tenants.toml");
    std::fs::write(&path, tenants_text).expect("write");
    let mut registry = ModelRegistry::with_identity();
    registry.add(
        Arc::new(Slow {
            sig: ModelSignature {
                name: "slow".into(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            delay: Duration::from_millis(400),
        }),
        4,
    );
    let cfg = AgentConfig {
        tenants: Some(path),
        ..AgentConfig::default()
    };
    (TestAgent::start_with(cfg, Some(registry)), dir)
}

fn slow_call(c: &Client) -> Result<(), ClientError> {
    c.model("slow")?.infer(&[]).map(|_| ())
}

#[test]
fn quotas_refuse_only_the_tenant_over_them() {
    let (agent, _dir) = quota_agent(&format!(
        "[[tenant]]\nname = \"small\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"*\"]\n\
         max_in_flight = 1\nmax_request_bytes = 1000\nmax_connections = 2\n\n\
         [[tenant]]\nname = \"other\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"*\"]\n",
        hex("s"),
        hex("o")
    ));
    let uri = agent.unix.clone();
    // In flight, over all its sessions: one slow request holds the quota.
    let s1 = with_token(&uri, Some("s")).expect("small 1");
    let s2 = with_token(&uri, Some("s")).expect("small 2");
    let held = std::thread::spawn(move || slow_call(&s1).map(|()| s1));
    common::wait_until(Duration::from_secs(5), "the slow request runs", || {
        agent.agent().stats().in_flight == 1
    });
    match slow_call(&s2) {
        Err(ClientError::TooManyInFlight(_)) | Err(ClientError::Remote { .. }) => {}
        Err(ClientError::Overloaded(m)) | Err(ClientError::LimitExceeded(m)) => {
            panic!("wrong refusal: {m}")
        }
        other => panic!("second in-flight request of 'small': {other:?}"),
    }
    // Another tenant is not held back.
    let o = with_token(&uri, Some("o")).expect("other");
    slow_call(&o).expect("other's request runs meanwhile");
    let _s1 = held
        .join()
        .expect("thread")
        .expect("the held request finishes");
    slow_call(&s2).expect("the quota is free again");
    // Sessions: two are open; a third is refused, naming the tenant.
    match with_token(&uri, Some("s")) {
        Err(ClientError::LimitExceeded(m)) => assert!(m.contains("'small'"), "{m}"),
        Err(e) => panic!("third session: {e}"),
        Ok(_) => panic!("third session of 'small' admitted"),
    }
    let _o2 = with_token(&uri, Some("o")).expect("other still connects");
    // Request bytes: the session's limits say so from its Hello.
    let big = vec![0u8; 1001];
    let m = s2.model("identity").expect("identity");
    match m.infer(&[TensorRef::new(DType::U8, &[1001], &big).expect("t")]) {
        Err(ClientError::LimitExceeded(_)) => {}
        other => panic!("1001 bytes for 'small': {other:?}"),
    }
    let ok = vec![0u8; 1000];
    m.infer(&[TensorRef::new(DType::U8, &[1000], &ok).expect("t")])
        .expect("1000 bytes pass");
    let snap = agent.agent().core().tenants().expect("tenants").snapshot();
    let small = snap.iter().find(|t| t.name == "small").expect("small");
    assert!(small.over_quota >= 2, "{small:?}");
    assert_eq!(small.in_flight, 0, "{small:?}");
}

#[test]
fn a_rate_quota_admits_its_burst_then_refuses_with_overloaded() {
    let (agent, _dir) = quota_agent(&format!(
        "[[tenant]]\nname = \"slowpoke\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n\
         requests_per_second = 0.5\nburst = 3\n\n\
         [[tenant]]\nname = \"other\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n",
        hex("r"),
        hex("o")
    ));
    let c = with_token(&agent.tcp, Some("r")).expect("connect");
    for i in 0..3 {
        identity_call(&c).unwrap_or_else(|e| panic!("burst request {i}: {e}"));
    }
    match identity_call(&c) {
        Err(ClientError::Overloaded(m)) => {
            assert!(m.contains("'slowpoke'") && m.contains("rate"), "{m}")
        }
        other => panic!("fourth request at once: {other:?}"),
    }
    let o = with_token(&agent.tcp, Some("o")).expect("other");
    for _ in 0..10 {
        identity_call(&o).expect("another tenant has no rate");
    }
}

#[test]
fn an_arena_quota_shrinks_the_shared_memory_session() {
    shm_dir();
    let dir = tempfile::tempdir().expect("tmp");
    let tenants = write_tenants(
        dir.path(),
        &format!(
            "[[tenant]]\nname = \"tight\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n\
             max_arena_bytes = 4_194_304\n\n\
             [[tenant]]\nname = \"roomy\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n",
            hex("t"),
            hex("r")
        ),
    );
    let shm = format!("shm://tw-arena-{}", std::process::id());
    let agent = ServeProcess::spawn(&["--tenants", &tenants, "--listen", &shm]);
    let tight = with_token(&shm, Some("t")).expect("tight");
    let info = tight.shm_info().expect("an shm session");
    assert!(
        info.client_len + info.agent_len <= 4 << 20,
        "{} + {}",
        info.client_len,
        info.agent_len
    );
    identity_call(&tight).expect("a small call fits");
    let roomy = with_token(&shm, Some("r")).expect("roomy");
    let info = roomy.shm_info().expect("an shm session");
    assert!(
        info.client_len > 64 << 20,
        "the default arena: {}",
        info.client_len
    );
    drop(agent);
}

#[test]
fn sighup_reloads_the_file_without_dropping_sessions_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().expect("tmp");
    let first = format!(
        "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"identity\"]\n",
        hex("k")
    );
    let tenants = write_tenants(dir.path(), &first);
    let agent = ServeProcess::spawn(&["--tenants", &tenants]);
    let c = with_token(&agent.uris[0], Some("k")).expect("connect");
    identity_call(&c).expect("allowed at first");
    // Identity taken away: the same session is refused from now on.
    write_tenants(
        dir.path(),
        &format!(
            "[[tenant]]\nname = \"a\"\ntokens_sha256 = [\"{}\"]\nmodels = []\n",
            hex("k")
        ),
    );
    agent.signal(libc::SIGHUP);
    common::wait_until(Duration::from_secs(10), "the reload takes effect", || {
        matches!(identity_call(&c), Err(ClientError::PermissionDenied(_)))
    });
    assert!(agent.stderr().contains("tenants reloaded: 1 tenants"));
    // A broken file: logged with its line, the rights in force stay.
    write_tenants(dir.path(), "[[tenant]]\nname = \"a\"\nweight = 0\n");
    agent.signal(libc::SIGHUP);
    common::wait_until(Duration::from_secs(10), "the refusal is logged", || {
        agent.stderr().contains("NOT reloaded")
    });
    assert!(
        agent.stderr().contains("tenants.toml:1:"),
        "{}",
        agent.stderr()
    );
    assert!(matches!(
        identity_call(&c),
        Err(ClientError::PermissionDenied(_))
    ));
    // Given back: the session works again, never reconnected.
    write_tenants(dir.path(), &first);
    agent.signal(libc::SIGHUP);
    common::wait_until(Duration::from_secs(10), "identity is back", || {
        identity_call(&c).is_ok()
    });
}

#[test]
fn a_bad_tenants_file_stops_the_agent_at_start_naming_the_line() {
    let dir = tempfile::tempdir().expect("tmp");
    let tenants = write_tenants(
        dir.path(),
        "[[tenant]]\nname = \"a\"\n\n[[tenant]]\nname = \"b\"\ntokens_sha256 = [\"xyz\"]\n",
    );
    let sock = format!("unix://{}/s.sock", dir.path().display());
    common::tensorwire_bin(); // built first: the limit is for the agent, not the build
    let (status, _, err) = run_bin(&["serve", "--listen", &sock, "--tenants", &tenants], LIMIT);
    assert!(!status.success());
    assert!(
        err.contains("tenants.toml:4:") && err.contains("not 64 hex digits"),
        "{err}"
    );
}

#[test]
fn a_request_by_id_learns_nothing_of_models_the_tenant_may_not_use() {
    // This uid is in no tenant and the file has no `default`: no rights.
    let (agent, _dir) = quota_agent(&format!(
        "[[tenant]]\nname = \"other\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"*\"]\n",
        hex("o")
    ));
    let mut peer = common::RawPeer::connect_hello(&agent.unix);
    let slow = agent.model_id("slow");
    let mut answers = Vec::new();
    for model_id in [slow, 9999] {
        let id = peer.id();
        let (h, desc, payload) = common::request(id, model_id, &[], 0);
        peer.send(&h, &desc, &payload);
        let msg = peer.expect_error(wire::Status::PermissionDenied, id);
        answers.push(msg.replace(&format!("id {model_id}"), "id N"));
    }
    // The same answer for a model that exists and one that does not, and
    // neither names a model.
    assert_eq!(answers[0], answers[1]);
    assert!(!answers[0].contains("slow"), "{}", answers[0]);
    peer.ping();
}

#[test]
fn listeners_beyond_loopback_need_insecure() {
    common::tensorwire_bin(); // built first: the limit is for the agent, not the build
    for uri in ["tcp://0.0.0.0:0", "grpc://0.0.0.0:0", "http://[::]:0"] {
        let (status, _, err) = run_bin(&["serve", "--listen", uri], LIMIT);
        assert!(!status.success(), "{uri}");
        assert!(
            err.contains("--insecure") && err.contains("clear text"),
            "{uri}: {err}"
        );
    }
    // With it the agent starts (and is stopped at once).
    let mut agent = ServeProcess::spawn(&["--insecure", "--listen", "tcp://0.0.0.0:0"]);
    assert!(
        agent.uris[1].starts_with("tcp://0.0.0.0:"),
        "{:?}",
        agent.uris
    );
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(LIMIT).success());
}

#[test]
fn unix_sockets_are_owner_only_unless_a_mode_is_given() {
    use std::os::unix::fs::PermissionsExt;
    let agent = ServeProcess::spawn(&[]);
    let mode = std::fs::metadata(&agent.sock_path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let open = ServeProcess::spawn(&["--socket-mode", "0660"]);
    let mode = std::fs::metadata(&open.sock_path)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o660, "{mode:o}");
}

/// Runs `tensorwire models` as another user: what it lists, or its error.
fn models_as(uid: u32, uri: &str, token: Option<&str>) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = tensorwire_command();
    cmd.args(["models", "--connect", uri]).uid(uid).gid(uid);
    match token {
        Some(t) => cmd.env("TENSORWIRE_TOKEN", t),
        None => cmd.env_remove("TENSORWIRE_TOKEN"),
    };
    let out = cmd.output().expect("run models as another user");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn another_user_s_process_is_matched_by_its_uid_and_kept_out_by_the_socket_mode() {
    if my_uid() != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let nobody = 65534;
    // The binary must be reachable by that user (a checkout under a 0700
    // home directory is not).
    let reachable = {
        use std::os::unix::process::CommandExt;
        tensorwire_command()
            .arg("--version")
            .uid(nobody)
            .gid(nobody)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !reachable {
        eprintln!(
            "skipped: uid {nobody} cannot run {}",
            common::tensorwire_bin().display()
        );
        return;
    }
    // Directories every user may enter, as a service's /run/tensorwire.
    let enterable = || {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::set_permissions(
            d.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        d
    };
    let (dir, dir2) = (enterable(), enterable());
    let tenants = write_tenants(
        dir.path(),
        &format!(
            "[[tenant]]\nname = \"svc\"\nuids = [{nobody}]\nmodels = [\"identity\"]\n\
             max_connections = 4\n"
        ),
    );
    let open = ServeProcess::spawn_in(
        dir.path(),
        &["--tenants", &tenants, "--socket-mode", "0666"],
    );
    let (ok, out) = models_as(nobody, &open.uris[0], None);
    assert!(ok, "{out}");
    assert!(out.contains("identity"), "{out}");
    // The default mode keeps that user out of the socket altogether.
    let closed = ServeProcess::spawn_in(dir2.path(), &["--tenants", &tenants]);
    let (ok, out) = models_as(nobody, &closed.uris[0], None);
    assert!(!ok, "{out}");
    assert!(out.to_lowercase().contains("permission denied"), "{out}");
}

/// Burns `cpu` of its thread's CPU time per run (not wall time: a
/// throttled thread takes longer).
struct Burn {
    sig: ModelSignature,
    cpu: Duration,
}

impl Backend for Burn {
    fn signature(&self) -> &ModelSignature {
        &self.sig
    }
    fn check_inputs(&self, _: &[(DType, &[u64])]) -> Result<(), EngineError> {
        Ok(())
    }
    fn run(&self, _: &[TensorView<'_>]) -> Result<Vec<Output>, EngineError> {
        let until = server::tenants::thread_cpu_ns() + self.cpu.as_nanos() as u64;
        let mut x = 1u64;
        while server::tenants::thread_cpu_ns() < until {
            for _ in 0..1000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        assert!(x != 0);
        Ok(Vec::new())
    }
}

#[test]
fn a_tenant_s_requests_run_in_its_cpu_cgroup_and_are_charged_to_it() {
    let parent = Path::new("/sys/fs/cgroup/cpu");
    let dir = parent.join(format!("tw-test-{}", std::process::id()));
    if std::fs::create_dir(&dir).is_err() {
        eprintln!("skipped: cannot create a cgroup under {}", parent.display());
        return;
    }
    struct Rmdir(std::path::PathBuf);
    impl Drop for Rmdir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _cleanup = Rmdir(dir.clone());
    // 10 % of one CPU.
    std::fs::write(dir.join("cpu.cfs_period_us"), "100000").expect("period");
    std::fs::write(dir.join("cpu.cfs_quota_us"), "10000").expect("quota");
    let tenants_dir = tempfile::tempdir().expect("tmp");
    let path = tenants_dir.path().join("tenants.toml");
    std::fs::write(
        &path,
        format!(
            "[[tenant]]\nname = \"capped\"\ntokens_sha256 = [\"{}\"]\nmodels = [\"*\"]\n\
             cpu_cgroup = \"{}\"\n",
            hex("c"),
            dir.display()
        ),
    )
    .expect("write");
    let mut registry = ModelRegistry::with_identity();
    registry.add(
        Arc::new(Burn {
            sig: ModelSignature {
                name: "burn".into(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            cpu: Duration::from_millis(40),
        }),
        1,
    );
    let agent = TestAgent::start_with(
        AgentConfig {
            tenants: Some(path),
            ..AgentConfig::default()
        },
        Some(registry),
    );
    let c = with_token(&agent.unix, Some("c")).expect("connect");
    c.model("burn")
        .expect("burn")
        .infer(&[])
        .expect("the request runs");
    // 40 ms of CPU at 10 % of a CPU: the cgroup throttled the worker.
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).expect("cpu.stat");
    let throttled: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("nr_throttled "))
        .and_then(|v| v.trim().parse().ok())
        .expect("nr_throttled");
    assert!(throttled > 0, "{stat}");
    // The worker went home once its turn ended.
    common::wait_until(Duration::from_secs(5), "the cgroup is empty again", || {
        std::fs::read_to_string(dir.join("tasks")).is_ok_and(|t| t.trim().is_empty())
    });
    let snap = agent.agent().core().tenants().expect("tenants").snapshot();
    let capped = snap.iter().find(|t| t.name == "capped").expect("capped");
    assert!(
        capped.cpu_ns >= 35_000_000,
        "the 40 ms were charged to it: {capped:?}"
    );
}

#[test]
fn a_cpu_cgroup_that_is_not_one_refuses_the_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let tenants = write_tenants(
        dir.path(),
        &format!(
            "[[tenant]]\nname = \"a\"\nmodels = [\"*\"]\ncpu_cgroup = \"{}\"\n",
            dir.path().display()
        ),
    );
    let sock = format!("unix://{}/s.sock", dir.path().display());
    common::tensorwire_bin(); // built first: the limit is for the agent, not the build
    let (status, _, err) = run_bin(&["serve", "--listen", &sock, "--tenants", &tenants], LIMIT);
    assert!(!status.success());
    assert!(err.contains("not a cgroup directory"), "{err}");
}
