//! The Go driver's tag templates: Go's `text/template` with the driver's
//! functions (aws-ebs-csi-driver `docs/tagging.md`, `pkg/util/template`),
//! as the driver runs it — a template parsed and executed with the
//! volume's (`PVCName`, `PVCNamespace`, `PVName`) or the snapshot's fields
//! as its data.
//!
//! Everything text/template has but what the driver takes away: text and
//! actions (`{{- ` and ` -}}` trimming, comments), pipelines, variables
//! (`$x := …`, `$x = …`, `$`), `if`/`else if`/`else`, `with`/`else with`,
//! `range` (over an integer, as Go 1.22's; a field is a string, over which
//! Go does not range either) with `break` and `continue`, and the builtins
//! `and`, `or`, `not`, `len`, `slice`, `print`, `printf`, `println`, `eq`,
//! `ne`, `lt`, `le`, `gt`, `ge`; the driver's `field DELIM N S`,
//! `substring START END S`, `toUpper S`, `toLower S`, `contains SUB S`,
//! `index SUB S` (in place of Go's `index`), `lastIndex SUB S`; `html`,
//! `js`, `call` and `urlquery` fail, as the driver makes them; `define`,
//! `template` and `block` (calls at most 1,000 deep).
//! `controller/src/template/go-answers.tsv` holds Go's own answers for a
//! set of templates, which the tests check this against, and `make test`
//! checks again against Go's text/template (`tests/tests/go_template.rs`).

mod exec;
mod lex;
mod parse;
mod printf;

/// Why a template cannot be expanded; the caller reports it as
/// INVALID_ARGUMENT.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("template {template:?}: {reason}")]
pub struct TemplateError {
    template: String,
    reason: String,
}

/// Expands `template` with `fields` (name without the dot, value), in the
/// order of the Go driver's struct (how `{{ . }}` prints them).
///
/// # Errors
/// What Go's `text/template` refuses, parsing (an unclosed action, an
/// unknown function, an undefined variable, a misplaced `end`, …) or
/// executing (a missing field, arguments of the wrong number or type, a
/// driver function's error, such as `field` past the last part).
pub fn expand(template: &str, fields: &[(&str, String)]) -> Result<String, TemplateError> {
    let error = |reason: String| TemplateError {
        template: template.to_owned(),
        reason,
    };
    let tree = parse::parse(lex::lex(template).map_err(error)?).map_err(error)?;
    exec::execute(&tree, fields).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Vec<(&'static str, String)> {
        vec![
            ("PVCName", "data-db-0".to_owned()),
            ("PVCNamespace", "Team-A".to_owned()),
            ("PVName", "pvc-5e1f".to_owned()),
        ]
    }

    fn expanded(template: &str) -> String {
        expand(template, &fields()).unwrap()
    }

    /// The examples of the Go driver's docs/tagging.md and its
    /// template_test.go cases.
    #[test]
    fn expands_the_go_drivers_functions_and_pipelines() {
        assert_eq!(expanded("{{ .PVCName }}"), "data-db-0");
        assert_eq!(expanded("{{ .PVCNamespace | toLower }}"), "team-a");
        assert_eq!(expanded(r#"{{ .PVCName | field "-" 1 }}"#), "db");
        assert_eq!(expanded("{{ .PVCName | substring 5 -1 }}"), "db-0");
        assert_eq!(
            expanded(r#"{{ toUpper (.PVCName | field "-" 0) }}-{{ .PVCNamespace }}"#),
            "DATA-Team-A"
        );
        assert_eq!(expanded("a {{- .PVCName -}} b"), "adata-db-0b");
    }

    #[test]
    fn expands_actions_variables_and_builtins() {
        assert_eq!(
            expanded(r#"{{ if eq .PVCNamespace "Team-A" }}a{{ else if .PVName }}b{{ else }}c{{ end }}"#),
            "a"
        );
        assert_eq!(expanded("{{ with .PVName }}{{ . }}{{ else }}none{{ end }}"), "pvc-5e1f");
        assert_eq!(
            expanded("{{ $n := .PVCName }}{{ $n = toUpper $n }}{{ $n }}"),
            "DATA-DB-0"
        );
        assert_eq!(
            expanded("{{ range $i := 3 }}{{ if eq $i 1 }}{{ continue }}{{ end }}{{ $i }}{{ end }}"),
            "02"
        );
        assert_eq!(
            expanded(r#"{{ printf "%s/%05d/%q" .PVCName 42 .PVName }}"#),
            "data-db-0/00042/\"pvc-5e1f\""
        );
        assert_eq!(
            expanded("{{ len .PVCName }} {{ slice .PVCName 5 7 }} {{ and 1 0 2 }} {{ or 0 \"\" 3 }}"),
            "9 db 0 3"
        );
        assert_eq!(expanded("{{ . }}"), "{data-db-0 Team-A pvc-5e1f}");
        assert_eq!(expanded("{{/* a comment */}}x{{- /* and one */ -}} y"), "xy");
    }

    #[test]
    fn refuses_what_go_refuses() {
        let refused = |template: &str| expand(template, &fields()).unwrap_err().reason;
        assert_eq!(refused("{{ .PVCName"), "unclosed action");
        assert_eq!(
            refused("{{ .Missing }}"),
            "can't evaluate field Missing in type *template.Props"
        );
        assert_eq!(
            refused("{{ html .PVCName }}"),
            "error calling html: cannot call 'html' function"
        );
        assert_eq!(refused("{{ nothing }}"), r#"function "nothing" not defined"#);
        assert_eq!(refused("{{ $x }}"), r#"undefined variable "$x""#);
        assert_eq!(refused("{{ if .PVCName }}x"), "unexpected EOF in if");
        assert_eq!(refused("{{ end }}"), "unexpected {{end}}");
        assert_eq!(
            refused(r#"{{ .PVCName | field "-" 3 }}"#),
            "error calling field: extractWord: cannot index into split string; index = 3, length = 3"
        );
        assert_eq!(refused("{{ toUpper 1 }}"), "expected string; found 1");
        assert_eq!(
            refused("{{ toUpper }}"),
            "wrong number of args for toUpper: want 1 got 0"
        );
        assert_eq!(
            refused("{{ lt .PVCName 1 }}"),
            "error calling lt: incompatible types for comparison: string and int"
        );
        assert_eq!(
            refused("{{ range .PVCName }}{{ end }}"),
            "range can't iterate over data-db-0"
        );
        assert_eq!(refused(r#"{{ template "x" }}"#), r#"no such template "x""#);
    }

    /// Go's text/template's own answers (`go-answers.tsv`: each line a
    /// template, whether Go expanded it, and what it printed, both quoted
    /// as Go's `%q` quotes; written by `tests/go/go-template`, which
    /// `tests/tests/go_template.rs` runs again in `make test`).
    #[test]
    fn matches_gos_answers() {
        let unquote = |quoted: &str| match lex::lex(&format!("{{{{{quoted}}}}}")).unwrap().as_slice() {
            [lex::Token::Open, lex::Token::Str(s), lex::Token::Close] => s.clone(),
            other => panic!("not a quoted string: {quoted} ({other:?})"),
        };
        let answers = include_str!("go-answers.tsv");
        let mut differ = Vec::new();
        for line in answers.lines() {
            let columns: Vec<&str> = line.split('\t').collect();
            let [template, outcome, output] = columns[..] else {
                panic!("a line of three columns: {line}")
            };
            let template = unquote(template);
            let ours = expand(&template, &fields());
            let go = (outcome == "ok").then(|| unquote(output));
            if ours.as_ref().ok() != go.as_ref() {
                differ.push(format!("{template:?}: Go {go:?}, here {ours:?}"));
            }
        }
        assert!(
            differ.is_empty(),
            "{} answers differ from Go's:\n{}",
            differ.len(),
            differ.join("\n")
        );
        assert!(answers.lines().count() >= 200, "the answers are all there");
    }
}
