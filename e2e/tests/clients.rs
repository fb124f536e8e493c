//! The client libraries under `clients/` (Go, Python, TypeScript, Java), against real
//! sidecars on the real control plane. Each language is built once, running its own tests
//! on the way (among them the check that every path and field it uses is in
//! `docs/sidecar-api.yaml`); then its `contend` program, driven line by line over stdin,
//! plays both sides of one lock: a holder sees "held", refusals come as typed errors
//! (`timeout`, `unknown_lock`, `invalid_lock_name`), a waiter is granted a higher token when
//! the holder releases and again when a holder is SIGKILLed, a hold forced away is reported
//! lost and no longer held, and a hold whose sidecar froze is counted lost by the client's
//! own CLOCK_BOOTTIME check, with no word from the sidecar.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold_harness::eventually;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::controller::fast;
use crate::support::{Env, Sidecar};

const LOCK: &str = "jobs";

fn clients_dir(language: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients").join(language)
}

/// Runs `command` in `clients/<language>`; fails the test with its output if it fails.
fn run(language: &str, what: &str, command: &mut Command) {
    let output = command.current_dir(clients_dir(language)).output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} in clients/{language}: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Builds a client, running its tests, and returns how to start its `contend` program.
fn build(language: &str, dir: &Path) -> Vec<String> {
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    match language {
        "go" => {
            let go = |args: &[&str]| {
                let mut c = Command::new("go");
                c.args(args).env("GOTOOLCHAIN", "local").env("GOFLAGS", "-mod=mod -buildvcs=false");
                c
            };
            run(language, "go vet", &mut go(&["vet", "./..."]));
            run(language, "go test", &mut go(&["test", "./..."]));
            let binary = dir.join("contend-go");
            run(language, "go build", &mut go(&["build", "-o", &path(binary.clone()), "./cmd/contend"]));
            vec![path(binary)]
        }
        "python" => {
            let mut unittest = Command::new("python3");
            unittest.args(["-m", "unittest", "discover", "-s", "tests", "-t", "."]).env("PYTHONDONTWRITEBYTECODE", "1");
            run(language, "python3 -m unittest", &mut unittest);
            vec!["python3".into(), path(clients_dir(language).join("examples").join("contend.py"))]
        }
        "typescript" => {
            run(language, "npm ci", Command::new("npm").args(["ci", "--no-audit", "--no-fund"]));
            run(language, "npm test", Command::new("npm").arg("test"));
            vec!["node".into(), path(clients_dir(language).join("dist").join("examples").join("contend.js"))]
        }
        "java" => {
            run(language, "mvn package", Command::new("mvn").args(["-q", "-B", "package"]));
            let classpath = std::fs::read_to_string(clients_dir(language).join("target").join("classpath.txt"))
                .expect("the classpath mvn package wrote");
            let classes = clients_dir(language).join("target").join("classes");
            let examples = clients_dir(language).join("target").join("test-classes");
            let classpath = format!("{}:{}:{}", path(classes), path(examples), classpath.trim());
            ["java", "-cp", &classpath, "dev.leasehold.client.examples.Contend"].map(String::from).to_vec()
        }
        other => panic!("no client in {other}"),
    }
}

/// A running `contend` program: commands go to its stdin, answers come line by line.
struct Contender {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Contender {
    fn start(program: &[String], sidecar: &Sidecar, lock: &str, wait: &str, log: &Path) -> Contender {
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("the contender log");
        let mut child = tokio::process::Command::new(&program[0])
            .args(&program[1..])
            .args([lock, wait])
            .env("LEASEHOLD_URL", format!("http://{}", sidecar.api))
            .env("PYTHONPATH", clients_dir("python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start contend");
        let stdin = child.stdin.take().expect("piped stdin");
        let lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        Contender { child, stdin, lines }
    }

    /// The next line it prints, split into words.
    async fn next(&mut self, timeout: Duration) -> Vec<String> {
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .expect("an answer in time")
            .expect("read its output")
            .expect("a line before it exited");
        line.split_whitespace().map(String::from).collect()
    }

    /// Sends `command` and returns the answer.
    async fn ask(&mut self, command: &str) -> Vec<String> {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.expect("send a command");
        self.stdin.flush().await.expect("send a command");
        self.next(Duration::from_secs(30)).await
    }

    /// Waits for the grant line; returns the token and what held() said.
    async fn granted(&mut self) -> (i64, String) {
        let words = self.next(Duration::from_secs(60)).await;
        assert_eq!(words.first().map(String::as_str), Some("granted"), "{words:?}");
        (words[1].parse().expect("a token"), words[2].clone())
    }

    /// Waits for the process to exit; returns its exit code.
    async fn exit_code(mut self) -> Option<i32> {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await.expect("exit in time");
        status.expect("wait for contend").code()
    }
}

async fn wait_local_waiting(sidecar: &Sidecar) {
    eventually("a caller waits for the lock in the sidecar", Duration::from_secs(30), || async {
        let view = sidecar.view(LOCK).await;
        if view["state"] == "waiting" { Ok(()) } else { Err(view.to_string()) }
    })
    .await;
}

/// The whole exchange for one language's client.
async fn two_clients_take_turns(language: &str) {
    let env = Env::new(&format!("cl-{}", &language[..2])).await;
    let _controller = env.controller(&["--leader-elect=false"]).await;
    // A short lease: a frozen sidecar's last deadline passes within seconds.
    env.lock(LOCK, fast()).await;
    let dir = env.log_dir();
    let program = tokio::task::spawn_blocking({
        let (language, dir) = (language.to_owned(), dir.clone());
        move || build(&language, &dir)
    })
    .await
    .expect("build the client");
    let (a, b) = (env.pod("a").await, env.pod("b").await);
    env.wait_claim_rbac(&a).await;
    let (sa, sb) = (env.sidecar(&a, &[]).await, env.sidecar(&b, &[]).await);
    let log = dir.join(format!("contend-{language}.log"));
    let start = |sidecar: &Sidecar, lock: &str, wait: &str| Contender::start(&program, sidecar, lock, wait, &log);

    // The first holds; held() says so.
    let mut first = start(&sa, LOCK, "30");
    let (first_token, held) = first.granted().await;
    assert_eq!(held, "true", "held() right after the grant");
    assert_eq!(first.ask("held").await, ["held", "true"]);

    // Refusals are typed: a try-lock on the held lock times out; an unknown lock and a name
    // that is no DNS label are named as such.
    let mut try_lock = start(&sb, LOCK, "0");
    assert_eq!(try_lock.next(Duration::from_secs(30)).await, ["error", "timeout"]);
    assert_eq!(try_lock.exit_code().await, Some(3));
    let mut unknown = start(&sb, "no-such-lock", "0");
    assert_eq!(unknown.next(Duration::from_secs(30)).await, ["error", "unknown_lock"]);
    assert_eq!(unknown.exit_code().await, Some(3));
    let mut bad_name = start(&sb, "Not_A_Label", "0");
    assert_eq!(bad_name.next(Duration::from_secs(30)).await, ["error", "invalid_lock_name"]);
    assert_eq!(bad_name.exit_code().await, Some(3));

    // The second waits; the first releases; the second is granted a higher token.
    let mut second = start(&sb, LOCK, "60");
    wait_local_waiting(&sb).await;
    assert_eq!(first.ask("release").await, ["released", "false"]);
    assert_eq!(first.exit_code().await, Some(0));
    let (second_token, held) = second.granted().await;
    assert!(second_token > first_token, "token {second_token} after {first_token}");
    assert_eq!(held, "true");

    // A third waits; the second is SIGKILLed (its session ends with it); the third is
    // granted a higher token.
    let mut third = start(&sa, LOCK, "60");
    wait_local_waiting(&sa).await;
    second.child.kill().await.expect("SIGKILL the holder");
    let (third_token, held) = third.granted().await;
    assert!(third_token > second_token, "token {third_token} after {second_token}");
    assert_eq!(held, "true");

    // The hold is forced away: the client observes the loss, and held() is false.
    env.force_release(LOCK, "maintenance", Some(&third_token.to_string())).await;
    let lost = third.ask("await-loss").await;
    assert_eq!(lost[..3], ["lost", "false", "lost:"], "the loss is the sidecar's `lost` event: {lost:?}");
    assert_eq!(third.ask("held").await, ["held", "false"]);
    assert_eq!(third.ask("release").await, ["released", "false"]);
    assert_eq!(third.exit_code().await, Some(0));

    // A fourth holds; its sidecar freezes and sends nothing more. The client counts the hold
    // lost once CLOCK_BOOTTIME passes the last deadline it was sent.
    let mut fourth = start(&sb, LOCK, "30");
    let (fourth_token, held) = fourth.granted().await;
    assert!(fourth_token > third_token, "token {fourth_token} after {third_token}");
    assert_eq!(held, "true");
    sb.process.signal(libc::SIGSTOP);
    let lost = fourth.ask("await-loss").await;
    sb.process.signal(libc::SIGCONT);
    assert_eq!(lost[..2], ["lost", "false"]);
    assert!(lost.join(" ").contains("deadline passed"), "the loss is the deadline's: {lost:?}");
    assert_eq!(fourth.ask("held").await, ["held", "false"]);
    assert_eq!(fourth.exit_code().await, Some(0));
}

#[tokio::test]
async fn go_client_takes_turns_by_release_and_by_kill_and_sees_a_forced_loss_and_a_passed_deadline() {
    two_clients_take_turns("go").await;
}

#[tokio::test]
async fn python_client_takes_turns_by_release_and_by_kill_and_sees_a_forced_loss_and_a_passed_deadline() {
    two_clients_take_turns("python").await;
}

#[tokio::test]
async fn typescript_client_takes_turns_by_release_and_by_kill_and_sees_a_forced_loss_and_a_passed_deadline() {
    two_clients_take_turns("typescript").await;
}

#[tokio::test]
async fn java_client_takes_turns_by_release_and_by_kill_and_sees_a_forced_loss_and_a_passed_deadline() {
    two_clients_take_turns("java").await;
}
