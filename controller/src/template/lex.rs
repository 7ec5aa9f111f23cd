//! The lexer: a template's text and the tokens of its actions, as Go's
//! `text/template/parse/lex.go` splits them — `{{` and `}}` delimiters,
//! `{{- ` and ` -}}` trimming the white space beside them, comments
//! `{{/* … */}}`, and inside an action spaces, fields, variables,
//! identifiers, strings, raw strings, characters, numbers, `:=`, `=`,
//! `|`, parentheses and commas.

/// One lexical item.
#[derive(Clone, Debug, PartialEq)]
pub enum Token {
    /// Text outside actions, already trimmed where a marker says so.
    Text(String),
    /// `{{`: an action starts.
    Open,
    /// `}}`: the action ends.
    Close,
    /// White space inside an action (it separates arguments).
    Space,
    /// `.`: the data at hand.
    Dot,
    /// `.Name`: a field.
    Field(String),
    /// `$` or `$name`.
    Variable(String),
    /// A function's name or a keyword (`if`, `range`, `end`, …).
    Identifier(String),
    /// `true` or `false`.
    Bool(bool),
    /// `nil`.
    Nil,
    /// A string constant, its escapes resolved.
    Str(String),
    /// A number as written (`42`, `-1`, `0x1F`, `1.5e3`).
    Number(String),
    /// A character constant (`'a'`), a number.
    Char(char),
    /// `:=`
    Declare,
    /// `=`
    Assign,
    /// `|`
    Pipe,
    /// `(`
    LeftParen,
    /// `)`
    RightParen,
    /// `,`
    Comma,
}

const SPACES: &[char] = &[' ', '\t', '\r', '\n'];

/// The tokens of `template`.
///
/// # Errors
/// An action or comment that is not closed, a string or character that
/// is not, a bad escape, a character no token starts with.
pub fn lex(template: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = template;
    let mut trim_next = false;
    loop {
        let (text, after) = match rest.find("{{") {
            Some(at) => (&rest[..at], Some(&rest[at + 2..])),
            None => (rest, None),
        };
        let mut text = if trim_next {
            text.trim_start_matches(SPACES)
        } else {
            text
        };
        let Some(mut action) = after else {
            push_text(&mut tokens, text);
            return Ok(tokens);
        };
        if action.starts_with('-') && action[1..].starts_with(SPACES) {
            text = text.trim_end_matches(SPACES);
            action = action[1..].trim_start_matches(SPACES);
        }
        push_text(&mut tokens, text);
        if let Some(comment) = action.strip_prefix("/*") {
            let end = comment.find("*/").ok_or("unclosed comment")?;
            let (close, trim) = right_delimiter(&comment[end + 2..]).ok_or("comment ends before closing delimiter")?;
            rest = &comment[end + 2 + close..];
            trim_next = trim;
            continue;
        }
        tokens.push(Token::Open);
        (rest, trim_next) = inside_action(action, &mut tokens)?;
        tokens.push(Token::Close);
    }
}

fn push_text(tokens: &mut Vec<Token>, text: &str) {
    if !text.is_empty() {
        tokens.push(Token::Text(text.to_owned()));
    }
}

/// Whether `text` starts with `}}` or ` -}}`: the length to skip and
/// whether the text after is to be trimmed.
fn right_delimiter(text: &str) -> Option<(usize, bool)> {
    if text.starts_with("}}") {
        return Some((2, false));
    }
    let spaces = text.len() - text.trim_start_matches(SPACES).len();
    (spaces > 0 && text[spaces..].starts_with("-}}")).then_some((spaces + 3, true))
}

/// Lexes one action's inside up to its closing delimiter; returns the
/// template after it and whether its text is to be trimmed.
fn inside_action<'a>(mut rest: &'a str, tokens: &mut Vec<Token>) -> Result<(&'a str, bool), String> {
    loop {
        if let Some((len, trim)) = right_delimiter(rest) {
            return Ok((&rest[len..], trim));
        }
        let c = rest.chars().next().ok_or("unclosed action")?;
        let (token, len) = match c {
            ' ' | '\t' | '\r' | '\n' => (Token::Space, rest.len() - rest.trim_start_matches(SPACES).len()),
            '=' => (Token::Assign, 1),
            ':' if rest.starts_with(":=") => (Token::Declare, 2),
            '|' => (Token::Pipe, 1),
            '(' => (Token::LeftParen, 1),
            ')' => (Token::RightParen, 1),
            ',' => (Token::Comma, 1),
            '"' => quoted(rest)?,
            '`' => {
                let end = rest[1..].find('`').ok_or("unterminated raw quoted string")?;
                (Token::Str(rest[1..=end].to_owned()), end + 2)
            }
            '\'' => character(rest)?,
            '$' => {
                let len = 1 + word_len(&rest[1..]);
                (Token::Variable(rest[..len].to_owned()), len)
            }
            '.' if rest[1..].starts_with(|c: char| c.is_ascii_digit()) => number(rest)?,
            '.' => match word_len(&rest[1..]) {
                0 => (Token::Dot, 1),
                len => (Token::Field(rest[1..=len].to_owned()), len + 1),
            },
            '+' | '-' | '0'..='9' => number(rest)?,
            c if c == '_' || c.is_alphabetic() => {
                let len = word_len(rest);
                let token = match &rest[..len] {
                    "true" => Token::Bool(true),
                    "false" => Token::Bool(false),
                    "nil" => Token::Nil,
                    word => Token::Identifier(word.to_owned()),
                };
                (token, len)
            }
            other => return Err(format!("unrecognized character in action: {other:?}")),
        };
        tokens.push(token);
        rest = &rest[len..];
    }
}

/// The length in bytes of the word `text` starts with (letters, digits, `_`).
fn word_len(text: &str) -> usize {
    text.find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len())
}

/// A number as Go's lexer takes it: a sign, then digits, letters, `_` and
/// `.` (prefixes, exponents, hex digits), and a sign after an exponent;
/// the parser decides whether it is one.
fn number(text: &str) -> Result<(Token, usize), String> {
    let bytes = text.as_bytes();
    let mut len = usize::from(matches!(bytes[0], b'+' | b'-'));
    while let Some(&b) = bytes.get(len) {
        let exponent_sign = matches!(b, b'+' | b'-') && matches!(bytes[len - 1], b'e' | b'E' | b'p' | b'P');
        if !(b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || exponent_sign) {
            break;
        }
        len += 1;
    }
    if len == 1 && !bytes[0].is_ascii_digit() {
        return Err(format!("bad number syntax: {:?}", &text[..1]));
    }
    Ok((Token::Number(text[..len].to_owned()), len))
}

/// A `"…"` string with Go's escapes (`strconv.Unquote`).
fn quoted(text: &str) -> Result<(Token, usize), String> {
    let mut out = String::new();
    let mut chars = text.char_indices().skip(1);
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((Token::Str(out), at + 1)),
            '\n' => break,
            '\\' => out.push(escape(&mut chars.by_ref().map(|(_, c)| c), '"')?),
            c => out.push(c),
        }
    }
    Err("unterminated quoted string".into())
}

/// A `'…'` character constant.
fn character(text: &str) -> Result<(Token, usize), String> {
    let mut chars = text.char_indices().skip(1);
    let value = match chars.next() {
        Some((_, '\\')) => escape(&mut chars.by_ref().map(|(_, c)| c), '\'')?,
        Some((_, c)) if c != '\'' && c != '\n' => c,
        _ => return Err("malformed character constant".into()),
    };
    match chars.next() {
        Some((at, '\'')) => Ok((Token::Char(value), at + 1)),
        _ => Err("unterminated character constant".into()),
    }
}

/// The character an escape (after its `\`) stands for, as Go's
/// `strconv.UnquoteChar` reads it.
fn escape(chars: &mut impl Iterator<Item = char>, quote: char) -> Result<char, String> {
    let bad = || "invalid syntax in escape".to_owned();
    let first = chars.next().ok_or_else(bad)?;
    let mut digits = |n: usize, radix: u32| -> Result<u32, String> {
        let text: String = chars.take(n).collect();
        if text.chars().count() == n {
            u32::from_str_radix(&text, radix).map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let c = match first {
        'a' => '\u{7}',
        'b' => '\u{8}',
        'f' => '\u{c}',
        'n' => '\n',
        'r' => '\r',
        't' => '\t',
        'v' => '\u{b}',
        '\\' => '\\',
        c if c == quote => c,
        'x' => char::from_u32(digits(2, 16)?).ok_or_else(bad)?,
        'u' => char::from_u32(digits(4, 16)?).ok_or_else(bad)?,
        'U' => char::from_u32(digits(8, 16)?).ok_or_else(bad)?,
        d @ '0'..='7' => {
            let rest = digits(2, 8)?;
            let value = d.to_digit(8).ok_or_else(bad)? * 64 + rest;
            char::from_u32(value).filter(|_| value < 256).ok_or_else(bad)?
        }
        _ => return Err(bad()),
    };
    Ok(c)
}
