//! `tensorwire torture --quick` against a real agent: every scenario runs
//! on every transport and listener it applies to (unix, tcp, shm, tls, the
//! http and grpc front doors, vsock where it can be reached), the well-behaved client beside each
//! attack is served without an error, the agent keeps no descriptor of
//! the attackers, the soak checks every answer, and results.json carries
//! what the report promises.

use common::tensorwire_command;
use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn torture_quick_is_clean() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = tensorwire_command()
        .args(["torture", "--quick", "--out"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tensorwire torture");
    let t0 = Instant::now();
    let limit = Duration::from_secs(300);
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("tensorwire torture --quick ran over {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("torture took {:.1?}:\n{stdout}", t0.elapsed());
    assert!(
        out.status.success(),
        "torture reported a defect ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let text = std::fs::read_to_string(dir.path().join("results.json")).expect("results.json");
    let r: Value = serde_json::from_str(&text).expect("results.json parses");
    let rows = r["scenarios"].as_array().expect("scenarios");
    let has = |name: &str, transport: &str| {
        rows.iter()
            .find(|x| x["name"] == name && x["transport"] == transport)
            .unwrap_or_else(|| panic!("no row {name} / {transport}"))
    };
    for t in ["unix", "tcp"] {
        for name in [
            "hostile bytes",
            "slowloris",
            "idle connections",
            "connect churn",
            "payload budget",
        ] {
            let row = has(name, t);
            assert!(row["tried"].as_u64().unwrap_or(0) > 0, "{row}");
            assert!(
                row["others_requests"].as_u64().unwrap_or(0) > 100,
                "the observer was barely served: {row}"
            );
        }
        assert!(has("hostile bytes", t)["tried"].as_u64() >= Some(3000));
    }
    let shm = has("hostile shm clients", "shm");
    assert!(shm["tried"].as_u64() >= Some(30), "{shm}");
    let row = has("payload budget, real bytes", "unix");
    assert!(row["tried"].as_u64() >= Some(16), "{row}");
    has("payload budget, real bytes (control)", "unix");
    // The other listeners get the same socket scenarios, with their own
    // protocol's hostile messages; vsock where this machine can reach
    // itself over it, else a row saying why not.
    for t in ["tls", "http", "grpc"] {
        for name in [
            "hostile bytes",
            "slowloris",
            "idle connections",
            "connect churn",
        ] {
            let row = has(name, t);
            assert!(row["tried"].as_u64().unwrap_or(0) > 0, "{row}");
            assert!(
                row["others_requests"].as_u64().unwrap_or(0) > 100,
                "the observer was barely served: {row}"
            );
        }
        assert!(has("hostile bytes", t)["tried"].as_u64() >= Some(600));
    }
    match rows
        .iter()
        .find(|x| x["name"] == "listener attacks" && x["transport"] == "vsock")
    {
        Some(skipped) => assert!(
            skipped["notes"][0]
                .as_str()
                .is_some_and(|n| n.starts_with("skipped: ")),
            "{skipped}"
        ),
        None => assert!(has("hostile bytes", "vsock")["tried"].as_u64() >= Some(600)),
    }
    for name in [
        "hostile shm clients",
        "shm ring indices broken",
        "shm sleep words held",
    ] {
        let shm = has(name, "shm");
        assert!(shm["tried"].as_u64() >= Some(30), "{shm}");
    }
    for t in ["unix", "tcp", "shm"] {
        has("client killed mid-request", t);
        for stage in ["queued", "computing", "answered"] {
            let row = rows
                .iter()
                .find(|x| {
                    x["transport"] == t
                        && x["name"].as_str().is_some_and(|n| {
                            n.starts_with(&format!("client killed while {stage} ("))
                        })
                })
                .unwrap_or_else(|| panic!("no kill row {stage} / {t}"));
            assert!(row["tried"].as_u64() >= Some(1), "{row}");
        }
        for name in [
            "agent stopped (SIGSTOP)",
            "agent killed (SIGKILL)",
            "agent restarted, client reconnects",
        ] {
            let row = has(name, t);
            assert_eq!(row["defects"], 0, "{row}");
        }
    }
    let soak = has("soak", "unix+tcp+shm");
    assert!(
        soak["others_requests"].as_u64().unwrap_or(0) > 1000,
        "the soak barely ran: {soak}"
    );
    assert_eq!(soak["others_wrong"], 0, "{soak}");
    let csv = std::fs::read_to_string(dir.path().join("soak.csv")).expect("soak.csv");
    assert!(csv.lines().count() >= 15, "a line per soak second: {csv}");
    for row in rows {
        for key in [
            "name",
            "transport",
            "tried",
            "others_errors",
            "others_p99_ratio",
            "leaks",
        ] {
            assert!(row.get(key).is_some(), "row has no {key}: {row}");
        }
        assert_eq!(row["defects"], 0, "{row}");
        assert_eq!(row["others_errors"], 0, "{row}");
        assert_eq!(row["leaks"]["fds"], 0, "{row}");
    }
    let report = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    assert!(report.contains("| hostile bytes | unix |"), "{report}");
}

/// `--only` runs the groups named and nothing else; a name that is not a
/// group is refused, naming the ones that are.
#[test]
fn torture_only_runs_the_groups_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = tensorwire_command()
        .args([
            "torture",
            "--quick",
            "--only",
            "faults",
            "--transports",
            "unix",
            "--out",
        ])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("run tensorwire torture");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(dir.path().join("results.json")).expect("results.json");
    let r: Value = serde_json::from_str(&text).expect("results.json parses");
    let names: Vec<String> = r["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .map(|x| format!("{} / {}", x["name"], x["transport"]).replace('"', ""))
        .collect();
    assert_eq!(
        names,
        [
            "agent stopped (SIGSTOP) / unix",
            "agent killed (SIGKILL) / unix",
            "agent restarted, client reconnects / unix",
        ],
        "{stdout}"
    );

    let out = tensorwire_command()
        .args(["torture", "--only", "kill"])
        .output()
        .expect("run tensorwire torture");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr
            .contains("'kill' is not one of sockets, shm, listeners, budget, kills, faults, soak"),
        "{stderr}"
    );
}
