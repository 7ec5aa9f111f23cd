//! The Go driver's tag templates: the subset of Go's `text/template` its
//! tag values use (aws-ebs-csi-driver `docs/tagging.md`,
//! `pkg/util/template`): actions `{{ … }}` (with `{{-` / `-}}` trimming
//! the spaces beside them) holding a pipeline — commands joined by `|`,
//! each a field (`.PVCName`), a string (`"…"` or `` `…` ``) or integer
//! literal, a parenthesized pipeline, or a function with its arguments,
//! the value piped in taken as its last argument. The functions are the
//! driver's: `field DELIM N S`, `substring START END S`, `toUpper S`,
//! `toLower S`, `contains SUB S`, `index SUB S`, `lastIndex SUB S`. Other
//! actions (`if`, `range`, variables, …) are refused.

use std::collections::HashMap;

/// Why a template cannot be expanded; the caller reports it as
/// INVALID_ARGUMENT.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("template {template:?}: {reason}")]
pub struct TemplateError {
    template: String,
    reason: String,
}

/// A value of a pipeline, printed as Go prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Text(String),
    Int(i64),
    Bool(bool),
}

impl Value {
    fn text(self, function: &str) -> Result<String, String> {
        match self {
            Self::Text(s) => Ok(s),
            other => Err(format!("{function}: wanted a string, got {other:?}")),
        }
    }

    fn int(self, function: &str) -> Result<i64, String> {
        match self {
            Self::Int(n) => Ok(n),
            other => Err(format!("{function}: wanted an integer, got {other:?}")),
        }
    }

    fn print(self) -> String {
        match self {
            Self::Text(s) => s,
            Self::Int(n) => n.to_string(),
            Self::Bool(b) => b.to_string(),
        }
    }
}

/// One lexical token inside an action.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Field(String),
    Name(String),
    Text(String),
    Int(i64),
    Open,
    Close,
    Pipe,
}

/// Expands every action of `template` with `fields` (name without the dot
/// → value).
///
/// # Errors
/// An unclosed action, an unknown field or function, a malformed
/// pipeline, or a function given the wrong arguments (`field` past the
/// last part, `substring` out of bounds).
pub fn expand(template: &str, fields: &HashMap<&str, String>) -> Result<String, TemplateError> {
    let error = |reason: String| TemplateError {
        template: template.to_owned(),
        reason,
    };
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        let end = rest[start..]
            .find("}}")
            .map(|e| start + e)
            .ok_or_else(|| error("an action is not closed".into()))?;
        let mut action = &rest[start + 2..end];
        let mut before = &rest[..start];
        if let Some(trimmed) = action.strip_prefix("- ") {
            before = before.trim_end();
            action = trimmed;
        }
        out.push_str(before);
        let mut after = &rest[end + 2..];
        if let Some(trimmed) = action.strip_suffix(" -") {
            after = after.trim_start();
            action = trimmed;
        }
        let tokens = lex(action).map_err(error)?;
        let mut at = 0;
        let value = pipeline(&tokens, &mut at, fields).map_err(error)?;
        if at != tokens.len() {
            return Err(error(format!("unexpected {:?}", tokens[at])));
        }
        out.push_str(&value.print());
        rest = after;
    }
    out.push_str(rest);
    Ok(out)
}

fn lex(action: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = action.trim_start();
    while let Some(c) = rest.chars().next() {
        let (token, len) = match c {
            '(' => (Token::Open, 1),
            ')' => (Token::Close, 1),
            '|' => (Token::Pipe, 1),
            '"' | '`' => {
                let close = rest[1..]
                    .find(c)
                    .ok_or_else(|| format!("a string is not closed: {rest}"))?;
                let text = &rest[1..=close];
                if c == '"' && text.contains('\\') {
                    return Err(format!("escapes in strings are not supported: {text}"));
                }
                (Token::Text(text.to_owned()), close + 2)
            }
            '.' => {
                let len = word_len(&rest[1..]);
                (Token::Field(rest[1..=len].to_owned()), len + 1)
            }
            '-' | '0'..='9' => {
                let len = 1 + rest[1..].find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len() - 1);
                let number = &rest[..len];
                (
                    Token::Int(number.parse().map_err(|_| format!("bad number {number}"))?),
                    len,
                )
            }
            c if c.is_alphabetic() => {
                let len = word_len(rest);
                (Token::Name(rest[..len].to_owned()), len)
            }
            other => return Err(format!("unexpected {other:?}")),
        };
        tokens.push(token);
        rest = rest[len..].trim_start();
    }
    Ok(tokens)
}

/// The length in bytes of the word `text` starts with (letters, digits, `_`).
fn word_len(text: &str) -> usize {
    text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len())
}

/// Commands joined by `|`, from `tokens[*at]` to the end or a `)`.
fn pipeline(tokens: &[Token], at: &mut usize, fields: &HashMap<&str, String>) -> Result<Value, String> {
    let mut piped = None;
    loop {
        piped = Some(command(tokens, at, fields, piped)?);
        if tokens.get(*at) != Some(&Token::Pipe) {
            return piped.ok_or_else(|| "an empty pipeline".to_owned());
        }
        *at += 1;
    }
}

/// One command: a function with its arguments (and the piped value last),
/// or a single operand.
fn command(
    tokens: &[Token],
    at: &mut usize,
    fields: &HashMap<&str, String>,
    piped: Option<Value>,
) -> Result<Value, String> {
    let function = match tokens.get(*at) {
        Some(Token::Name(name)) => {
            *at += 1;
            Some(name.clone())
        }
        _ => None,
    };
    let mut args = Vec::new();
    while let Some(token) = tokens.get(*at).filter(|t| !matches!(t, Token::Pipe | Token::Close)) {
        *at += 1;
        args.push(match token {
            Token::Field(name) => Value::Text(
                fields
                    .get(name.as_str())
                    .cloned()
                    .ok_or_else(|| format!("unknown field .{name}"))?,
            ),
            Token::Text(s) => Value::Text(s.clone()),
            Token::Int(n) => Value::Int(*n),
            Token::Open => {
                let value = pipeline(tokens, at, fields)?;
                if tokens.get(*at) != Some(&Token::Close) {
                    return Err("a parenthesis is not closed".into());
                }
                *at += 1;
                value
            }
            Token::Name(name) => return Err(format!("{name}: a function is an argument; put it in parentheses")),
            Token::Pipe | Token::Close => unreachable!("stopped above"),
        });
    }
    args.extend(piped);
    match function {
        Some(name) => call(&name, args),
        None if args.len() == 1 => Ok(args.remove(0)),
        None if args.is_empty() => Err("an empty command".into()),
        None => Err("only a function takes arguments".into()),
    }
}

/// The Go driver's functions (`pkg/util/template/funcs.go`), with its
/// argument order: the string worked on comes last, so it can be piped.
fn call(name: &str, args: Vec<Value>) -> Result<Value, String> {
    let given = args.len();
    let arity = |n: usize| {
        if given == n {
            Ok(())
        } else {
            Err(format!("{name} takes {n} arguments, not {given}"))
        }
    };
    let mut args = args.into_iter();
    let mut next = || args.next().ok_or_else(|| format!("{name}: missing argument"));
    match name {
        "toUpper" | "toLower" => {
            arity(1)?;
            let s = next()?.text(name)?;
            Ok(Value::Text(if name == "toUpper" {
                s.to_uppercase()
            } else {
                s.to_lowercase()
            }))
        }
        "contains" | "index" | "lastIndex" => {
            arity(2)?;
            let (sub, s) = (next()?.text(name)?, next()?.text(name)?);
            let position = |p: Option<usize>| Value::Int(p.map_or(-1, |p| i64::try_from(p).unwrap_or(i64::MAX)));
            Ok(match name {
                "contains" => Value::Bool(s.contains(&sub)),
                "index" => position(s.find(&sub)),
                _ => position(s.rfind(&sub)),
            })
        }
        "field" => {
            arity(3)?;
            let (delimiter, n, s) = (next()?.text(name)?, next()?.int(name)?, next()?.text(name)?);
            let parts: Vec<&str> = s.split(delimiter.as_str()).collect();
            usize::try_from(n)
                .ok()
                .and_then(|n| parts.get(n))
                .map(|part| Value::Text((*part).to_owned()))
                .ok_or_else(|| {
                    format!(
                        "field: no part {n} of {s:?} split by {delimiter:?} ({} parts)",
                        parts.len()
                    )
                })
        }
        "substring" => {
            arity(3)?;
            let (start, end, s) = (next()?.int(name)?, next()?.int(name)?, next()?.text(name)?);
            let len = s.len();
            let clamp = |n: i64| usize::try_from(n).ok();
            // As the Go driver: a negative start means from the first
            // byte, a negative or too large end up to the last.
            let from = clamp(start).unwrap_or(0);
            let to = clamp(end).filter(|e| *e <= len).unwrap_or(len);
            s.get(from..to)
                .map(|part| Value::Text(part.to_owned()))
                .ok_or_else(|| format!("substring: {start}..{end} is outside {s:?}"))
        }
        other => Err(format!("unknown function {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> HashMap<&'static str, String> {
        HashMap::from([
            ("PVCName", "data-db-0".to_owned()),
            ("PVCNamespace", "Team-A".to_owned()),
        ])
    }

    fn expanded(template: &str) -> String {
        expand(template, &fields()).unwrap()
    }

    /// The examples of the Go driver's docs/tagging.md and its
    /// template_test.go cases, with what Go's text/template prints.
    #[test]
    fn expands_the_go_drivers_functions_and_pipelines() {
        assert_eq!(expanded("{{ .PVCName }}"), "data-db-0");
        assert_eq!(expanded("{{ .PVCNamespace | toLower }}"), "team-a");
        assert_eq!(expanded("{{ toUpper .PVCName }}"), "DATA-DB-0");
        assert_eq!(expanded(r#"{{ .PVCName | field "-" 1 }}"#), "db");
        assert_eq!(expanded(r#"{{ field "-" 2 .PVCName }}"#), "0");
        assert_eq!(expanded("{{ .PVCName | substring 0 4 }}"), "data");
        assert_eq!(expanded("{{ .PVCName | substring 5 -1 }}"), "db-0");
        assert_eq!(expanded("{{ .PVCName | substring -1 4 }}"), "data");
        assert_eq!(expanded(r#"{{ .PVCName | contains "db" }}"#), "true");
        assert_eq!(expanded(r#"{{ .PVCName | index "-" }}"#), "4");
        assert_eq!(expanded(r#"{{ .PVCName | lastIndex "-" }}"#), "7");
        assert_eq!(expanded(r#"{{ .PVCName | index "x" }}"#), "-1");
        assert_eq!(
            expanded(r#"{{ toUpper (.PVCName | field "-" 0) }}-{{ .PVCNamespace }}"#),
            "DATA-Team-A"
        );
        assert_eq!(expanded("a {{- .PVCName -}} b"), "adata-db-0b");
        assert_eq!(expanded(r#"{{ `x-y` | field "-" 1 | toUpper }}"#), "Y");
    }

    #[test]
    fn refuses_what_it_cannot_expand_exactly() {
        let refused = |template: &str| expand(template, &fields()).unwrap_err().reason;
        assert_eq!(refused("{{ .PVCName"), "an action is not closed");
        assert_eq!(refused("{{ .PVName }}"), "unknown field .PVName");
        assert_eq!(refused("{{ html .PVCName }}"), "unknown function html");
        assert_eq!(refused("{{ if .PVCName }}x{{ end }}"), "unknown function if");
        assert_eq!(
            refused(r#"{{ .PVCName | field "-" 3 }}"#),
            r#"field: no part 3 of "data-db-0" split by "-" (3 parts)"#
        );
        assert_eq!(
            refused("{{ .PVCName | substring 6 2 }}"),
            r#"substring: 6..2 is outside "data-db-0""#
        );
        assert_eq!(refused("{{ toUpper 1 }}"), "toUpper: wanted a string, got Int(1)");
        assert_eq!(refused("{{ .PVCName .PVCName }}"), "only a function takes arguments");
        assert_eq!(refused("{{ toUpper }}"), "toUpper takes 1 arguments, not 0");
        assert_eq!(refused("{{ (toUpper .PVCName }}"), "a parenthesis is not closed");
        assert_eq!(refused("{{ }}"), "an empty command");
    }
}
