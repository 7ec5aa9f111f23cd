//! Execution: a template's tree walked with the volume's or snapshot's
//! fields as its data, as Go's `text/template/exec.go` walks it — values
//! printed as `fmt.Print` prints them, truth as Go's (`false`, `0`, the
//! empty string are false), variables scoped to the structure that
//! declares them, `and` and `or` evaluating their arguments only as far
//! as they must, the arguments of the driver's functions converted as
//! Go's reflection converts them (a number constant becomes an `int`
//! parameter only if it is an integer, nothing else becomes a `string`),
//! and text/template's builtins with their errors.

use super::parse::{Branch, Node, Number, Operand, Pipeline, Tree};
use super::printf;

/// A value a pipeline yields: what the driver's data and functions and
/// Go's builtins can give.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
    /// The data itself (`.`, `$`): the driver's `*Props`.
    Data,
    /// No value: dot in a template called without a pipeline.
    Nil,
}

impl Value {
    /// The Go type's name, as errors and `%!verb(type=value)` give it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::Str(_) => "string",
            Self::Int(_) => "int",
            Self::Float(_) => "float64",
            Self::Bool(_) => "bool",
            Self::Data => "*template.Props",
            Self::Nil => "<nil>",
        }
    }

    /// Go's truth (`exec.go` `isTrue`): false, 0 and "" are false.
    fn truth(&self) -> bool {
        match self {
            Self::Str(s) => !s.is_empty(),
            Self::Int(n) => *n != 0,
            Self::Float(f) => *f != 0.0,
            Self::Bool(b) => *b,
            Self::Data => true,
            Self::Nil => false,
        }
    }
}

/// The driver's functions (`pkg/util/template/funcs.go`, which replace
/// Go's `index`, `html`, `js`, `call` and `urlquery`) and Go's other
/// builtins (`text/template/funcs.go`).
const FUNCTIONS: [&str; 22] = [
    "and",
    "or",
    "not",
    "len",
    "slice",
    "print",
    "printf",
    "println",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "html",
    "js",
    "call",
    "urlquery",
    "contains",
    "toUpper",
    "toLower",
    "substring",
];
const MORE_FUNCTIONS: [&str; 3] = ["field", "index", "lastIndex"];

/// Whether `name` is a function a template may call.
pub fn is_function(name: &str) -> bool {
    FUNCTIONS.contains(&name) || MORE_FUNCTIONS.contains(&name)
}

/// A parameter's type in a function's Go signature.
#[derive(Clone, Copy)]
enum Param {
    Str,
    Int,
    /// `interface{}` or `reflect.Value`: any value as it is.
    Any,
}

/// A function's parameters, and whether the last repeats (`...`).
fn signature(name: &str) -> (&'static [Param], bool) {
    use Param::{Any, Int, Str};
    match name {
        "not" | "len" => (&[Any], false),
        "slice" | "eq" => (&[Any, Any], true),
        "print" | "println" | "html" | "js" | "call" | "urlquery" => (&[Any], true),
        "printf" => (&[Str, Any], true),
        "ne" | "lt" | "le" | "gt" | "ge" => (&[Any, Any], false),
        "contains" | "index" | "lastIndex" => (&[Str, Str], false),
        "toUpper" | "toLower" => (&[Str], false),
        "substring" => (&[Int, Int, Str], false),
        "field" => (&[Str, Int, Str], false),
        _ => (&[], false),
    }
}

/// Where a `range` body goes next.
enum Flow {
    Next,
    Break,
    Continue,
}

/// The text `tree` gives with `fields` (in the Go struct's order) as its
/// data.
///
/// # Errors
/// What Go's execution reports: a missing field, a function given
/// arguments of the wrong number or type, a driver function's error, a
/// comparison of incompatible values, a `range` over what is not an
/// integer.
pub fn execute(tree: &Tree, fields: &[(&str, String)]) -> Result<String, String> {
    let mut state = State {
        fields,
        defined: &tree.defined,
        variables: vec![("$".to_owned(), Value::Data)],
        depth: 0,
        out: String::new(),
    };
    state.walk(&Value::Data, &tree.main)?;
    Ok(state.out)
}

/// How deep templates may call templates (Go's `maxExecDepth` is 100,000;
/// this one keeps a recursive template off the thread's stack).
const MAX_DEPTH: usize = 1000;

struct State<'a> {
    fields: &'a [(&'a str, String)],
    defined: &'a [(String, Vec<Node>)],
    variables: Vec<(String, Value)>,
    depth: usize,
    out: String,
}

impl State<'_> {
    fn walk(&mut self, dot: &Value, nodes: &[Node]) -> Result<Flow, String> {
        for node in nodes {
            let flow = match node {
                Node::Text(text) => {
                    self.out.push_str(text);
                    Flow::Next
                }
                Node::Action(pipeline) => {
                    let value = self.pipeline(dot, pipeline)?;
                    if pipeline.declared.is_empty() {
                        let printed = self.print(&value);
                        self.out.push_str(&printed);
                    }
                    Flow::Next
                }
                Node::If(branch) | Node::With(branch) => {
                    let scope = self.variables.len();
                    let value = self.pipeline(dot, &branch.pipeline)?;
                    let flow = match (value.truth(), node) {
                        (true, Node::With(_)) => self.walk(&value, &branch.list)?,
                        (true, _) => self.walk(dot, &branch.list)?,
                        (false, _) => self.walk(dot, &branch.otherwise)?,
                    };
                    self.variables.truncate(scope);
                    flow
                }
                Node::Range(branch) => self.range(dot, branch)?,
                Node::Break => Flow::Break,
                Node::Continue => Flow::Continue,
                Node::Template(name, pipeline) => {
                    let dot = match pipeline {
                        Some(pipeline) => self.pipeline(dot, pipeline)?,
                        None => Value::Nil,
                    };
                    self.template(name, dot)?;
                    Flow::Next
                }
            };
            if !matches!(flow, Flow::Next) {
                return Ok(flow);
            }
        }
        Ok(Flow::Next)
    }

    /// The template `name` with `dot`, and `$` dot, as its data.
    fn template(&mut self, name: &str, dot: Value) -> Result<(), String> {
        let defined = self.defined;
        let (_, list) = defined
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| format!("no such template {name:?}"))?;
        if self.depth == MAX_DEPTH {
            return Err(format!("exceeded maximum template depth ({MAX_DEPTH})"));
        }
        let variables = std::mem::replace(&mut self.variables, vec![("$".to_owned(), dot.clone())]);
        self.depth += 1;
        let walked = self.walk(&dot, list);
        self.depth -= 1;
        self.variables = variables;
        walked.map(|_| ())
    }

    /// `range` over an integer n: its body with dot (and its variable)
    /// 0 … n-1 (Go 1.22); over anything else, an error.
    fn range(&mut self, dot: &Value, branch: &Branch) -> Result<Flow, String> {
        let scope = self.variables.len();
        let value = self.pipeline(dot, &branch.pipeline)?;
        let Value::Int(count) = value else {
            return Err(format!("range can't iterate over {}", self.print(&value)));
        };
        if branch.pipeline.declared.len() > 1 {
            return Err(format!("can't use {count} to iterate over more than one variable"));
        }
        let declared = self.variables.len();
        for i in 0..count {
            if !branch.pipeline.declared.is_empty() {
                self.variables[declared - 1].1 = Value::Int(i);
            }
            let flow = self.walk(&Value::Int(i), &branch.list)?;
            self.variables.truncate(declared);
            if matches!(flow, Flow::Break) {
                break;
            }
        }
        if count <= 0 {
            self.walk(dot, &branch.otherwise)?;
        }
        self.variables.truncate(scope);
        Ok(Flow::Next)
    }

    fn pipeline(&mut self, dot: &Value, pipeline: &Pipeline) -> Result<Value, String> {
        let mut value = None;
        for command in &pipeline.commands {
            value = Some(self.command(dot, command, value)?);
        }
        let value = value.ok_or("missing value for command")?;
        for name in &pipeline.declared {
            if pipeline.assigns {
                let variable = self
                    .variables
                    .iter_mut()
                    .rev()
                    .find(|(n, _)| n == name)
                    .ok_or_else(|| format!("undefined variable: {name}"))?;
                variable.1 = value.clone();
            } else {
                self.variables.push((name.clone(), value.clone()));
            }
        }
        Ok(value)
    }

    /// A command's value; `piped` is the previous command's, its last
    /// argument.
    fn command(&mut self, dot: &Value, command: &[Operand], piped: Option<Value>) -> Result<Value, String> {
        let with_arguments = command.len() > 1 || piped.is_some();
        let no_arguments = |what: &str| {
            if with_arguments {
                Err(format!("can't give argument to non-function {what}"))
            } else {
                Ok(())
            }
        };
        match &command[0] {
            Operand::Function(name) => self.call(dot, name, &command[1..], piped),
            Operand::Field(chain) => self.chain(dot.clone(), chain, with_arguments),
            Operand::Variable(name, chain) if chain.is_empty() => {
                no_arguments(name)?;
                self.variable(name)
            }
            Operand::Variable(name, chain) => {
                let value = self.variable(name)?;
                self.chain(value, chain, with_arguments)
            }
            Operand::Pipeline(pipeline, chain) if chain.is_empty() => {
                no_arguments("a parenthesized pipeline")?;
                self.pipeline(dot, pipeline)
            }
            Operand::Pipeline(pipeline, chain) => {
                let value = self.pipeline(dot, pipeline)?;
                self.chain(value, chain, with_arguments)
            }
            Operand::Nil => Err("nil is not a command".into()),
            constant => {
                no_arguments("a constant")?;
                self.argument(dot, constant, Param::Any)
            }
        }
    }

    fn variable(&self, name: &str) -> Result<Value, String> {
        self.variables
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
            .ok_or_else(|| format!("undefined variable: {name}"))
    }

    /// The fields `chain` of `value`; only the data has fields, and they
    /// are strings, never functions.
    fn chain(&self, mut value: Value, chain: &[String], with_arguments: bool) -> Result<Value, String> {
        for name in chain {
            value = match value {
                Value::Data => self
                    .fields
                    .iter()
                    .find(|(field, _)| field == name)
                    .map(|(_, v)| Value::Str(v.clone()))
                    .ok_or_else(|| format!("can't evaluate field {name} in type *template.Props"))?,
                // Go's evalField: a field of no value is no value.
                Value::Nil => Value::Nil,
                other => return Err(format!("can't evaluate field {name} in type {}", other.type_name())),
            };
        }
        if with_arguments {
            return Err(format!(
                "{} has arguments but cannot be invoked as function",
                chain.last().map_or("", String::as_str)
            ));
        }
        Ok(value)
    }

    /// An argument for a parameter of type `param`, converted as Go's
    /// `evalArg` converts it.
    fn argument(&mut self, dot: &Value, operand: &Operand, param: Param) -> Result<Value, String> {
        let value = match (operand, param) {
            (Operand::Number(number), Param::Int) => {
                return number
                    .int
                    .map(Value::Int)
                    .ok_or_else(|| format!("expected integer; found {}", number.text));
            }
            (Operand::Number(number), Param::Any) => return ideal(number),
            (Operand::Number(number), Param::Str) => return Err(format!("expected string; found {}", number.text)),
            (Operand::Bool(b), Param::Any) => return Ok(Value::Bool(*b)),
            (Operand::Bool(b), _) => return Err(format!("expected {}; found {b}", param.name())),
            (Operand::Str(s), Param::Str | Param::Any) => return Ok(Value::Str(s.clone())),
            (Operand::Str(s), Param::Int) => return Err(format!("expected integer; found {s:?}")),
            (Operand::Nil, _) => return Err(format!("cannot assign nil to {}", param.name())),
            (Operand::Dot, _) => dot.clone(),
            (Operand::Function(name), _) => self.call(dot, name, &[], None)?,
            (Operand::Field(_) | Operand::Variable(..) | Operand::Pipeline(..), _) => {
                self.command(dot, std::slice::from_ref(operand), None)?
            }
        };
        checked(value, param)
    }

    /// Calls the function `name` with `operands` and the piped value last.
    fn call(&mut self, dot: &Value, name: &str, operands: &[Operand], piped: Option<Value>) -> Result<Value, String> {
        let given = operands.len() + usize::from(piped.is_some());
        let (params, variadic) = signature(name);
        if name == "and" || name == "or" {
            if given == 0 {
                return Err(format!("wrong number of args for {name}: want at least 1 got 0"));
            }
            let mut value = None;
            for operand in operands {
                let v = self.argument(dot, operand, Param::Any)?;
                if v.truth() == (name == "or") {
                    return Ok(v);
                }
                value = Some(v);
            }
            return Ok(piped.or(value).unwrap_or(Value::Bool(false)));
        }
        let fixed = if variadic { params.len() - 1 } else { params.len() };
        if (variadic && given < fixed) || (!variadic && given != fixed) {
            let want = if variadic {
                format!("at least {fixed}")
            } else {
                fixed.to_string()
            };
            return Err(format!("wrong number of args for {name}: want {want} got {given}"));
        }
        let param = |i: usize| params[i.min(params.len() - 1)];
        let mut args = Vec::with_capacity(given);
        for (i, operand) in operands.iter().enumerate() {
            args.push(self.argument(dot, operand, param(i))?);
        }
        if let Some(value) = piped {
            args.push(checked(value, param(given - 1))?);
        }
        apply(name, args).map_err(|e| format!("error calling {name}: {e}"))
    }

    /// A value as an action prints it (`fmt.Print`; no value as Go's
    /// text/template prints it).
    fn print(&self, value: &Value) -> String {
        match value {
            Value::Nil => "<no value>".to_owned(),
            Value::Data => {
                let values: Vec<&str> = self.fields.iter().map(|(_, v)| v.as_str()).collect();
                format!("{{{}}}", values.join(" "))
            }
            other => printf::plain(other),
        }
    }
}

impl Param {
    fn name(self) -> &'static str {
        match self {
            Self::Str => "string",
            Self::Int => "int",
            Self::Any => "interface {}",
        }
    }
}

/// A value given to a parameter of type `param`: Go's `validateType`.
fn checked(value: Value, param: Param) -> Result<Value, String> {
    match (&value, param) {
        (_, Param::Any) | (Value::Str(_), Param::Str) | (Value::Int(_), Param::Int) => Ok(value),
        (other, _) => Err(format!(
            "wrong type for value; expected {}; got {}",
            param.name(),
            other.type_name()
        )),
    }
}

/// A number constant where any type will do (Go's `idealConstant`): a
/// float if written as one (a `.`, an exponent; not hex or a character),
/// else an integer.
fn ideal(number: &Number) -> Result<Value, String> {
    let text = number.text.to_ascii_lowercase();
    let hex_int = text.trim_start_matches(['+', '-']).starts_with("0x") && !text.contains('p');
    let float_like = !hex_int && !text.starts_with('\'') && text.contains(['.', 'e', 'p']);
    match (number.float, number.int) {
        (Some(f), _) if float_like => Ok(Value::Float(f)),
        (_, Some(n)) => Ok(Value::Int(n)),
        _ => Err(format!("{} overflows int", number.text)),
    }
}

/// Runs the function `name` on `args`, already converted to its
/// parameters' types.
fn apply(name: &str, args: Vec<Value>) -> Result<Value, String> {
    let text = |i: usize| match &args[i] {
        Value::Str(s) => s.as_str(),
        _ => "",
    };
    let int = |i: usize| match args[i] {
        Value::Int(n) => n,
        _ => 0,
    };
    Ok(match name {
        "not" => Value::Bool(!args[0].truth()),
        "len" => match &args[0] {
            Value::Str(s) => Value::Int(i64::try_from(s.len()).unwrap_or(i64::MAX)),
            other => return Err(format!("len of type {}", other.type_name())),
        },
        "slice" => slice(&args)?,
        "print" => Value::Str(printf::sprint(&args)),
        "println" => Value::Str(printf::sprintln(&args)),
        "printf" => Value::Str(printf::sprintf(text(0), &args[1..])),
        "eq" => Value::Bool(equal(&args[0], &args[1..])?),
        "ne" => Value::Bool(!equal(&args[0], &args[1..])?),
        "lt" => Value::Bool(less(&args[0], &args[1])?),
        "le" => Value::Bool(less(&args[0], &args[1])? || equal(&args[0], &args[1..])?),
        "gt" => Value::Bool(!(less(&args[0], &args[1])? || equal(&args[0], &args[1..])?)),
        "ge" => Value::Bool(!less(&args[0], &args[1])?),
        "html" | "js" | "call" | "urlquery" => return Err(format!("cannot call '{name}' function")),
        "contains" => Value::Bool(text(1).contains(text(0))),
        "toUpper" => Value::Str(map_runes(text(0), char::to_uppercase)),
        "toLower" => Value::Str(map_runes(text(0), char::to_lowercase)),
        "substring" => Value::Str(substring(int(0), int(1), text(2))?),
        "field" => {
            let parts = split(text(2), text(0));
            let at = usize::try_from(int(1))
                .ok()
                .filter(|&i| i < parts.len())
                .ok_or_else(|| {
                    format!(
                        "extractWord: cannot index into split string; index = {}, length = {}",
                        int(1),
                        parts.len()
                    )
                })?;
            Value::Str(parts[at].to_owned())
        }
        "index" | "lastIndex" => {
            let found = if name == "index" {
                text(1).find(text(0))
            } else {
                text(1).rfind(text(0))
            };
            Value::Int(found.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX)))
        }
        other => return Err(format!("function {other:?} not defined")),
    })
}

/// Each character mapped as Go's `strings.ToUpper`/`ToLower` map a rune:
/// to one rune, or left as it is where Unicode gives more than one.
fn map_runes<I: Iterator<Item = char> + ExactSizeIterator>(text: &str, map: fn(char) -> I) -> String {
    text.chars()
        .map(|c| {
            let mut mapped = map(c);
            if mapped.len() == 1 {
                mapped.next().unwrap_or(c)
            } else {
                c
            }
        })
        .collect()
}

/// Go's `strings.Split`: an empty separator splits between characters.
fn split<'a>(text: &'a str, separator: &str) -> Vec<&'a str> {
    if separator.is_empty() {
        text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect()
    } else {
        text.split(separator).collect()
    }
}

/// The driver's `substring START END S` on bytes, with its rules (a
/// negative start means from the first byte, a negative or too large end
/// up to the last); where Go's slice would panic, an error.
fn substring(start: i64, end: i64, text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let len = bytes.len();
    let index = |n: i64| usize::try_from(n).ok();
    let (from, to) = if start < 0 {
        (Some(0), index(end).filter(|&e| e <= len))
    } else if end < 0 || index(end).is_none_or(|e| e > len) {
        (index(start).filter(|&s| s <= len), Some(len))
    } else {
        (index(start), index(end))
    };
    match (from, to) {
        (Some(from), Some(to)) if from <= to => Ok(String::from_utf8_lossy(&bytes[from..to]).into_owned()),
        _ => Err(format!(
            "runtime error: slice bounds out of range [{start}:{end}] with length {len}"
        )),
    }
}

/// Go's `slice` builtin on a string: bytes `[i:j]`.
fn slice(args: &[Value]) -> Result<Value, String> {
    let Value::Str(text) = &args[0] else {
        return Err(format!("can't slice item of type {}", args[0].type_name()));
    };
    if args.len() > 3 {
        return Err("cannot 3-index slice a string".into());
    }
    let len = text.len();
    let mut bounds = [0, len];
    for (i, arg) in args[1..].iter().enumerate() {
        let Value::Int(n) = arg else {
            return Err(format!("cannot index slice/array with type {}", arg.type_name()));
        };
        bounds[i] = usize::try_from(*n)
            .ok()
            .filter(|&n| n <= len)
            .ok_or_else(|| format!("index out of range: {n}"))?;
    }
    if bounds[0] > bounds[1] {
        return Err(format!("invalid slice index: {} > {}", bounds[0], bounds[1]));
    }
    Ok(Value::Str(
        String::from_utf8_lossy(&text.as_bytes()[bounds[0]..bounds[1]]).into_owned(),
    ))
}

/// Go's `eq arg1 arg2…`: whether `first` equals any of `others`.
fn equal(first: &Value, others: &[Value]) -> Result<bool, String> {
    if others.is_empty() {
        return Err("missing argument for comparison".into());
    }
    for other in others {
        let same = match (first, other) {
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Data, Value::Data) | (Value::Nil, Value::Nil) => true,
            (Value::Nil, _) | (_, Value::Nil) => false,
            (a, b) => return Err(incompatible(a, b)),
        };
        if same {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Go's `lt`: integers, floats and strings, each with its own kind.
fn less(a: &Value, b: &Value) -> Result<bool, String> {
    match (a, b) {
        (Value::Data | Value::Nil, _) | (_, Value::Data | Value::Nil) | (Value::Bool(_), Value::Bool(_)) => {
            Err("invalid type for comparison".into())
        }
        (Value::Str(a), Value::Str(b)) => Ok(a < b),
        (Value::Int(a), Value::Int(b)) => Ok(a < b),
        (Value::Float(a), Value::Float(b)) => Ok(a < b),
        (a, b) => Err(incompatible(a, b)),
    }
}

fn incompatible(a: &Value, b: &Value) -> String {
    format!(
        "incompatible types for comparison: {} and {}",
        a.type_name(),
        b.type_name()
    )
}
