//! Go's `fmt` for the values a template has (`print`, `println`,
//! `printf`, and every value an action prints): `%v` `%s` `%q` `%d` `%b`
//! `%o` `%x` `%X` `%c` `%U` `%t` `%e` `%E` `%f` `%F` `%g` `%G` `%%`, the
//! flags `-` `+` `#` ` ` `0`, a width and a precision, and Go's
//! `%!verb(type=value)`, `%!verb(MISSING)`, `%!(EXTRA …)` and
//! `%!(NOVERB)` where the format and the arguments disagree (`fmt`'s
//! package documentation, "Format errors"). Not taken: `*` widths and
//! `[n]` argument indexes.

use super::exec::Value;

/// A value as `%v` prints it.
pub fn plain(value: &Value) -> String {
    format(value, 'v', &Spec::default()).unwrap_or_default()
}

/// `fmt.Sprint`: a space between two operands when neither is a string.
pub fn sprint(args: &[Value]) -> String {
    let mut out = String::new();
    for (i, arg) in args.iter().enumerate() {
        let string = matches!(arg, Value::Str(_));
        if i > 0 && !string && !matches!(args[i - 1], Value::Str(_)) {
            out.push(' ');
        }
        out.push_str(&plain(arg));
    }
    out
}

/// `fmt.Sprintln`: a space between every two operands, a newline after.
pub fn sprintln(args: &[Value]) -> String {
    let words: Vec<String> = args.iter().map(plain).collect();
    words.join(" ") + "\n"
}

/// A verb's flags, width and precision.
#[derive(Default)]
struct Spec {
    minus: bool,
    plus: bool,
    sharp: bool,
    space: bool,
    zero: bool,
    width: Option<usize>,
    precision: Option<usize>,
}

/// `fmt.Sprintf`.
pub fn sprintf(format_text: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut chars = format_text.chars().peekable();
    let mut next_arg = 0;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = Spec::default();
        while let Some(&flag) = chars.peek() {
            match flag {
                '-' => spec.minus = true,
                '+' => spec.plus = true,
                '#' => spec.sharp = true,
                ' ' => spec.space = true,
                '0' => spec.zero = true,
                _ => break,
            }
            chars.next();
        }
        spec.width = digits(&mut chars);
        if chars.peek() == Some(&'.') {
            chars.next();
            spec.precision = Some(digits(&mut chars).unwrap_or(0));
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        match args.get(next_arg) {
            None => out.push_str(&format!("%!{verb}(MISSING)")),
            Some(arg) => out.push_str(
                &format(arg, verb, &spec).unwrap_or_else(|| format!("%!{verb}({}={})", arg.type_name(), plain(arg))),
            ),
        }
        next_arg += 1;
    }
    if next_arg < args.len() {
        let extra: Vec<String> = args[next_arg..]
            .iter()
            .map(|arg| format!("{}={}", arg.type_name(), plain(arg)))
            .collect();
        out.push_str(&format!("%!(EXTRA {})", extra.join(", ")));
    }
    out
}

fn digits(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<usize> {
    let mut number = None;
    while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
        number = Some(number.unwrap_or(0) * 10 + d as usize);
        chars.next();
    }
    number
}

/// `value` formatted by `verb`, padded to the width; `None` for a verb
/// the value's type does not take.
fn format(value: &Value, verb: char, spec: &Spec) -> Option<String> {
    let (sign, body) = match value {
        Value::Str(s) => (String::new(), string(s, verb, spec)?),
        Value::Int(n) => (
            sign(*n < 0, spec).to_owned(),
            integer(n.unsigned_abs(), *n, verb, spec)?,
        ),
        Value::Float(f) => float(*f, verb, spec)?,
        Value::Bool(b) if matches!(verb, 'v' | 't') => (String::new(), b.to_string()),
        Value::Nil if verb == 'v' => (String::new(), "<nil>".into()),
        Value::Bool(_) | Value::Data | Value::Nil => return None,
    };
    Some(pad(&sign, &body, spec))
}

/// A number's sign: `-`, or `+` or a space where the flags ask for one.
fn sign(negative: bool, spec: &Spec) -> &'static str {
    if negative {
        "-"
    } else if spec.plus {
        "+"
    } else if spec.space {
        " "
    } else {
        ""
    }
}

/// Pads `sign` and `body` to the width: spaces before (after with `-`),
/// or zeros between sign and body with `0`.
fn pad(sign: &str, body: &str, spec: &Spec) -> String {
    let len = sign.chars().count() + body.chars().count();
    let fill = spec.width.unwrap_or(0).saturating_sub(len);
    if spec.minus {
        format!("{sign}{body}{}", " ".repeat(fill))
    } else if spec.zero {
        format!("{sign}{}{body}", "0".repeat(fill))
    } else {
        format!("{}{sign}{body}", " ".repeat(fill))
    }
}

fn string(s: &str, verb: char, spec: &Spec) -> Option<String> {
    let s: String = match spec.precision {
        Some(p) => s.chars().take(p).collect(),
        None => s.to_owned(),
    };
    Some(match verb {
        'v' | 's' => s,
        'q' => quote(&s),
        'x' => hex(s.as_bytes(), spec, false),
        'X' => hex(s.as_bytes(), spec, true),
        _ => return None,
    })
}

fn hex(bytes: &[u8], spec: &Spec, upper: bool) -> String {
    let prefix = if upper { "0X" } else { "0x" };
    let mut out = String::new();
    for (i, b) in bytes.iter().enumerate() {
        if spec.space && i > 0 {
            out.push(' ');
        }
        if spec.sharp && (i == 0 || spec.space) {
            out.push_str(prefix);
        }
        out.push_str(&if upper { format!("{b:02X}") } else { format!("{b:02x}") });
    }
    out
}

/// Go's `strconv.Quote`.
fn quote(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        out.push_str(&quoted_char(c, '"'));
    }
    out.push('"');
    out
}

fn quoted_char(c: char, quote: char) -> String {
    match c {
        '\u{7}' => "\\a".into(),
        '\u{8}' => "\\b".into(),
        '\u{c}' => "\\f".into(),
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        '\u{b}' => "\\v".into(),
        '\\' => "\\\\".into(),
        c if c == quote => format!("\\{c}"),
        c if c == ' ' || !(c.is_control() || c.is_whitespace()) => c.to_string(),
        c if u32::from(c) < 0x80 => format!("\\x{:02x}", u32::from(c)),
        c if u32::from(c) < 0x1_0000 => format!("\\u{:04x}", u32::from(c)),
        c => format!("\\U{:08x}", u32::from(c)),
    }
}

/// The digits of an integer (its sign apart) for `verb`.
fn integer(magnitude: u64, n: i64, verb: char, spec: &Spec) -> Option<String> {
    let digits = match verb {
        'v' | 'd' => magnitude.to_string(),
        'b' => format!("{magnitude:b}"),
        'o' => format!("{}{magnitude:o}", if spec.sharp { "0" } else { "" }),
        'O' => format!("0o{magnitude:o}"),
        'x' => format!("{}{magnitude:x}", if spec.sharp { "0x" } else { "" }),
        'X' => format!("{}{magnitude:X}", if spec.sharp { "0X" } else { "" }),
        'c' => return u32::try_from(n).ok().and_then(char::from_u32).map(String::from),
        'q' => {
            return u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .map(|c| format!("'{}'", quoted_char(c, '\'')));
        }
        'U' => return Some(format!("U+{magnitude:04X}")),
        _ => return None,
    };
    Some(match spec.precision {
        Some(p) if digits.len() < p => format!("{}{digits}", "0".repeat(p - digits.len())),
        _ => digits,
    })
}

/// A float's sign and digits for `verb`, as Go's `strconv.FormatFloat`
/// writes them (exponents with a sign and at least two digits).
fn float(f: f64, verb: char, spec: &Spec) -> Option<(String, String)> {
    let sign = sign(f.is_sign_negative() && !f.is_nan(), spec);
    let f = f.abs();
    if f.is_nan() {
        return Some((String::new(), "NaN".into()));
    }
    if f.is_infinite() {
        return Some((if sign.is_empty() { "+" } else { sign }.to_owned(), "Inf".into()));
    }
    let body = match verb {
        'v' | 'g' | 'G' => general(f, spec.precision, verb == 'G'),
        'e' | 'E' => exponent(&format!("{:.*e}", spec.precision.unwrap_or(6), f), verb == 'E'),
        'f' | 'F' => format!("{:.*}", spec.precision.unwrap_or(6), f),
        _ => return None,
    };
    Some((sign.to_owned(), body))
}

/// Rust's `1.5e3` written as Go writes it: `1.5e+03`.
fn exponent(rust: &str, upper: bool) -> String {
    let (mantissa, exp) = rust.split_once('e').unwrap_or((rust, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let e = if upper { 'E' } else { 'e' };
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}{e}{sign}{:02}", exp.abs())
}

/// `%g` (and `%v`): the shortest digits, or `precision` significant
/// ones, in `%e` form where the exponent is below -4 or at least the
/// precision (6 for the shortest), else in `%f` form.
fn general(f: f64, precision: Option<usize>, upper: bool) -> String {
    let scientific = match precision {
        None => format!("{f:e}"),
        Some(p) => format!("{:.*e}", p.max(1) - 1, f),
    };
    let (mantissa, exp) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let mantissa = if mantissa.contains('.') {
        mantissa.trim_end_matches('0').trim_end_matches('.')
    } else {
        mantissa
    };
    let significant = i32::try_from(mantissa.chars().filter(char::is_ascii_digit).count()).unwrap_or(i32::MAX);
    let limit = match precision {
        None => 6,
        Some(p) => {
            let p = i32::try_from(p.max(1)).unwrap_or(i32::MAX);
            if p > significant && significant > exp {
                significant
            } else {
                p
            }
        }
    };
    if exp < -4 || exp >= limit {
        return exponent(&format!("{mantissa}e{exp}"), upper);
    }
    let decimals = usize::try_from((significant - (exp + 1)).max(0)).unwrap_or(0);
    format!("{f:.decimals$}")
}
