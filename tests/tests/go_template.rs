//! The controller's tag templates (`controller/src/template`) against Go's
//! own `text/template`: `controller/src/template/go-answers.tsv` holds, for
//! each template, whether Go expanded it and what it printed, and the
//! controller's unit tests check its implementation against that file;
//! here `tests/go/go-template` (Go's text/template with the Go driver's
//! functions and data, built by `make go-tools`) answers the same
//! templates again, and must answer exactly what the file says. So the
//! file holds Go's answers, never ones written by hand. To add a template,
//! add a line with it quoted and regenerate the file:
//! `cut -f1 go-answers.tsv | <target dir>/go/bin/go-template`.

use std::io::Write;
use std::process::{Command, Stdio};

use ebs_csi_tests::{go_tool, repository};

#[test]
fn the_recorded_answers_are_gos() {
    let path = repository().join("controller/src/template/go-answers.tsv");
    let recorded = std::fs::read_to_string(&path).expect("go-answers.tsv");
    let mut go = Command::new(go_tool("go-template"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("go-template");
    go.stdin
        .take()
        .expect("stdin")
        .write_all(recorded.as_bytes())
        .expect("writing the templates");
    let answered = go.wait_with_output().expect("go-template's answers");
    assert!(answered.status.success(), "go-template: {}", answered.status);
    let answered = String::from_utf8(answered.stdout).expect("UTF-8");
    let differ: Vec<String> = recorded
        .lines()
        .zip(answered.lines())
        .filter(|(r, a)| r != a)
        .map(|(r, a)| format!("recorded {r}\n   Go now {a}"))
        .collect();
    assert!(differ.is_empty(), "go-answers.tsv is not Go's:\n{}", differ.join("\n"));
    assert_eq!(
        recorded.lines().count(),
        answered.lines().count(),
        "one answer per template"
    );
}
