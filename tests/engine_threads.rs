//! Each model's ONNX Runtime threads, against a real `tensorwire serve`:
//! a model that sets `intra_threads` (the `--model NAME=PATH;intra_threads=N`
//! flag, a `[[model]]` table) or a repository model whose `config.pbtxt`
//! sets Triton's `intra_op_thread_count` parameter runs with N intra-op
//! threads, and the others with the agent's `--intra-threads`. The threads
//! are counted where they live: ONNX Runtime makes each session's pool when
//! the model loads, N − 1 threads (the caller is the N-th), each named
//! `tw-ort` (`/proc/PID/task/*/comm`).

use common::{digits_model, wait_until, ServeProcess};
use std::time::Duration;

/// The agent's ONNX Runtime pool threads.
fn ort_threads(agent: &ServeProcess) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", agent.pid())) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "tw-ort")
        .count()
}

/// Waits (at most 10 s) until the agent has `want` pool threads, and
/// checks it keeps that many.
fn expect_ort_threads(agent: &ServeProcess, want: usize, what: &str) {
    wait_until(Duration::from_secs(10), what, || ort_threads(agent) >= want);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(ort_threads(agent), want, "{what}");
}

#[test]
fn a_model_flag_sets_that_models_intra_op_threads_only() {
    let digits = digits_model();
    let digits = digits.to_str().expect("a UTF-8 path");
    let own = format!("small={digits};intra_threads=1");
    let agents = format!("large={digits}");
    // The agent's 4 threads: 3 pool threads for `large`, none for `small`
    // (with the flag ignored there would be 6).
    let agent = ServeProcess::spawn(&["--intra-threads", "4", "--model", &own, "--model", &agents]);
    expect_ort_threads(&agent, 3, "large's 3 pool threads, none for small");
}

#[test]
fn a_model_table_sets_that_models_intra_op_threads_only() {
    let digits = digits_model();
    let toml = format!(
        "intra_threads = 2\n\
         [[model]]\nname = \"wide\"\npath = {digits:?}\nintra_threads = 4\n\
         [[model]]\nname = \"plain\"\npath = {digits:?}\n"
    );
    let agent = ServeProcess::spawn_with_config(&toml, &[]);
    expect_ort_threads(&agent, 3 + 1, "wide's 3 pool threads, plain's 1");
}

#[test]
fn a_repository_models_intra_op_thread_count_sets_its_threads() {
    let repo = tempfile::tempdir().expect("a repository directory");
    for (name, config) in [
        (
            "one",
            r#"parameters { key: "intra_op_thread_count" value: { string_value: "1" } }"#,
        ),
        ("default", ""),
    ] {
        let version = repo.path().join(name).join("1");
        std::fs::create_dir_all(&version).expect("model directory");
        std::fs::copy(digits_model(), version.join("model.onnx")).expect("copy the model");
        std::fs::write(repo.path().join(name).join("config.pbtxt"), config).expect("config.pbtxt");
    }
    let repo_path = repo.path().to_str().expect("a UTF-8 path");
    let agent = ServeProcess::spawn(&["--intra-threads", "3", "--model-repository", repo_path]);
    expect_ort_threads(&agent, 2, "default's 2 pool threads, none for one");
}

#[test]
fn a_bad_intra_op_thread_count_is_refused_with_the_reason() {
    let digits = digits_model();
    let digits = digits.to_str().expect("a UTF-8 path");
    let out = common::tensorwire_command()
        .args(["serve", "--listen", "unix:///nonexistent/x.sock", "--model"])
        .arg(format!("d={digits};intra_threads=0"))
        .output()
        .expect("run tensorwire serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("intra_threads must be 1..=256"), "{err}");
}
