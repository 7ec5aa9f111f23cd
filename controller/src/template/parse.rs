//! The parser: a template's tree, as Go's `text/template/parse` builds it
//! — text, actions holding a pipeline, `if`, `with` and `range` with
//! their `else` (and `else if`, `else with`) lists, `break` and
//! `continue` inside `range`, `template` and `block` calling templates
//! that `define` (at the top level only) or `block` name — with the
//! checks Go makes while parsing:
//! every function is one the driver knows ([`super::exec::is_function`]),
//! every variable is declared before it is used, and only the first
//! command of a pipeline may be a constant.

use super::exec;
use super::lex::Token;

/// One node of a template's tree.
#[derive(Debug, PartialEq)]
pub enum Node {
    /// Text printed as it is.
    Text(String),
    /// `{{ pipeline }}`: its value printed, unless it declares a variable.
    Action(Pipeline),
    /// `{{ if pipeline }} list {{ else }} otherwise {{ end }}`.
    If(Branch),
    /// `{{ with pipeline }}`: `list` with the value as dot, if it is true.
    With(Branch),
    /// `{{ range pipeline }}`: `list` once per element, `otherwise` if none.
    Range(Branch),
    /// `{{ break }}`
    Break,
    /// `{{ continue }}`
    Continue,
    /// `{{ template "name" pipeline }}` (and a `block`): the named
    /// template with the pipeline's value (or nothing) as dot.
    Template(String, Option<Pipeline>),
}

/// A parsed template: its main list and the templates it defines.
#[derive(Debug, Default)]
pub struct Tree {
    pub main: Vec<Node>,
    pub defined: Vec<(String, Vec<Node>)>,
}

/// A control structure's parts.
#[derive(Debug, PartialEq)]
pub struct Branch {
    pub pipeline: Pipeline,
    pub list: Vec<Node>,
    pub otherwise: Vec<Node>,
}

/// Commands joined by `|`, each command's value the next one's last
/// argument; it may first declare (`:=`) or assign (`=`) variables.
#[derive(Debug, PartialEq)]
pub struct Pipeline {
    pub declared: Vec<String>,
    pub assigns: bool,
    pub commands: Vec<Vec<Operand>>,
}

/// One operand of a command.
#[derive(Debug, PartialEq)]
pub enum Operand {
    /// A function's name.
    Function(String),
    /// `.`
    Dot,
    /// `nil`
    Nil,
    /// `true`, `false`
    Bool(bool),
    /// A string constant.
    Str(String),
    /// A number constant.
    Number(Number),
    /// `.A.B`: fields of dot.
    Field(Vec<String>),
    /// `$x.A.B`: a variable and fields of it.
    Variable(String, Vec<String>),
    /// `(pipeline).A.B`
    Pipeline(Box<Pipeline>, Vec<String>),
}

/// A number constant as Go's parser reads it (`parse.NumberNode`): its
/// text, its value as an integer where it is one, as a float where it is
/// one.
#[derive(Debug, PartialEq)]
pub struct Number {
    pub text: String,
    pub int: Option<i64>,
    pub float: Option<f64>,
}

/// The tree of `tokens`.
///
/// # Errors
/// What Go's parser refuses: an unknown function, an undefined variable,
/// an `end` or `else` without its structure, a structure without its
/// `end`, an empty or malformed pipeline, `break` outside `range`, a
/// `define` inside another structure, two definitions of one name.
pub fn parse(tokens: Vec<Token>) -> Result<Tree, String> {
    let mut parser = Parser {
        tokens,
        at: 0,
        variables: vec!["$".to_owned()],
        ranges: 0,
        top_level: true,
        defined: Vec::new(),
    };
    match parser.list()? {
        (main, Closer::Eof) => Ok(Tree {
            main,
            defined: parser.defined,
        }),
        (_, Closer::End) => Err("unexpected {{end}}".into()),
        (_, Closer::Else) => Err("unexpected {{else}}".into()),
    }
}

/// What ended a list of nodes.
enum Closer {
    Eof,
    End,
    Else,
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    /// The variables in scope, innermost last.
    variables: Vec<String>,
    /// How many `range` bodies the parser is in.
    ranges: usize,
    /// Whether the parser is in the template's main list (where alone
    /// `define` may stand).
    top_level: bool,
    /// The templates `define` and `block` named.
    defined: Vec<(String, Vec<Node>)>,
}

impl Parser {
    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn skip_space(&mut self) {
        while self.peek() == Some(&Token::Space) {
            self.at += 1;
        }
    }

    fn next_non_space(&mut self) -> Option<Token> {
        self.skip_space();
        self.next()
    }

    fn expect_close(&mut self, context: &str) -> Result<(), String> {
        match self.next_non_space() {
            Some(Token::Close) => Ok(()),
            other => Err(format!("unexpected {other:?} in {context}")),
        }
    }

    /// Nodes up to the end of the template, an `{{end}}` or an `{{else`.
    fn list(&mut self) -> Result<(Vec<Node>, Closer), String> {
        let mut list = Vec::new();
        loop {
            match self.next() {
                None => return Ok((list, Closer::Eof)),
                Some(Token::Text(text)) => list.push(Node::Text(text)),
                Some(Token::Open) => match self.action()? {
                    Action::Node(node) => list.push(node),
                    Action::Defined => {}
                    Action::End => return Ok((list, Closer::End)),
                    Action::Else => return Ok((list, Closer::Else)),
                },
                Some(other) => return Err(format!("unexpected {other:?}")),
            }
        }
    }

    fn action(&mut self) -> Result<Action, String> {
        self.skip_space();
        let keyword = match self.peek() {
            Some(Token::Identifier(word)) if !exec::is_function(word) => word.clone(),
            _ => return Ok(Action::Node(Node::Action(self.pipeline("command", &Token::Close)?))),
        };
        self.at += 1;
        Ok(match keyword.as_str() {
            "if" => Action::Node(Node::If(self.control("if")?)),
            "with" => Action::Node(Node::With(self.control("with")?)),
            "range" => Action::Node(Node::Range(self.control("range")?)),
            "end" => {
                self.expect_close("end")?;
                Action::End
            }
            "else" => Action::Else,
            "break" | "continue" if self.ranges == 0 => return Err(format!("{{{{{keyword}}}}} outside {{{{range}}}}")),
            "break" => {
                self.expect_close("break")?;
                Action::Node(Node::Break)
            }
            "continue" => {
                self.expect_close("continue")?;
                Action::Node(Node::Continue)
            }
            "define" if self.top_level => {
                let (name, _) = self.template_name("define", false)?;
                let list = self.definition(&name)?;
                self.define(name, list)?;
                Action::Defined
            }
            "template" => {
                let (name, pipeline) = self.template_name("template", true)?;
                Action::Node(Node::Template(name, pipeline))
            }
            "block" => {
                let (name, pipeline) = self.template_name("block", true)?;
                let pipeline = pipeline.ok_or("missing value for block")?;
                let list = self.definition(&name)?;
                self.define(name.clone(), list)?;
                Action::Node(Node::Template(name, Some(pipeline)))
            }
            "define" => return Err("unexpected {{define}} in command".into()),
            other => return Err(format!("function {other:?} not defined")),
        })
    }

    /// The quoted name after `define`, `template` or `block`, and the
    /// pipeline after it where one may follow, up to `}}`.
    fn template_name(&mut self, context: &str, takes_pipeline: bool) -> Result<(String, Option<Pipeline>), String> {
        let Some(Token::Str(name)) = self.next_non_space() else {
            return Err(format!("unexpected name in {context}: a quoted name is needed"));
        };
        self.skip_space();
        if self.peek() == Some(&Token::Close) || !takes_pipeline {
            self.expect_close(context)?;
            return Ok((name, None));
        }
        Ok((name, Some(self.pipeline(context, &Token::Close)?)))
    }

    /// The list of a `define` or `block` up to its `{{end}}`, parsed in a
    /// scope of its own (`$` alone).
    fn definition(&mut self, name: &str) -> Result<Vec<Node>, String> {
        let variables = std::mem::replace(&mut self.variables, vec!["$".to_owned()]);
        let (top_level, ranges) = (self.top_level, self.ranges);
        (self.top_level, self.ranges) = (false, 0);
        let parsed = self.list();
        (self.variables, self.top_level, self.ranges) = (variables, top_level, ranges);
        match parsed? {
            (list, Closer::End) => Ok(list),
            _ => Err(format!("unexpected end of template {name:?}")),
        }
    }

    /// Adds a named template; a name may be given only one list that is
    /// not blank (Go's `parse.Tree.add`).
    fn define(&mut self, name: String, list: Vec<Node>) -> Result<(), String> {
        let blank = |list: &[Node]| {
            list.iter()
                .all(|node| matches!(node, Node::Text(text) if text.trim().is_empty()))
        };
        match self.defined.iter_mut().find(|(n, _)| *n == name) {
            Some((_, existing)) if blank(existing) => *existing = list,
            Some(_) if blank(&list) => {}
            Some(_) => return Err(format!("template: multiple definition of template {name:?}")),
            None => self.defined.push((name, list)),
        }
        Ok(())
    }

    /// `if`, `with` or `range` after its keyword, up to its `{{end}}`.
    fn control(&mut self, context: &'static str) -> Result<Branch, String> {
        let scope = self.variables.len();
        let pipeline = self.pipeline(context, &Token::Close)?;
        let top_level = std::mem::replace(&mut self.top_level, false);
        self.ranges += usize::from(context == "range");
        let (list, end) = self.list()?;
        self.ranges -= usize::from(context == "range");
        let otherwise = match end {
            Closer::Eof => return Err(format!("unexpected EOF in {context}")),
            Closer::End => Vec::new(),
            Closer::Else => self.otherwise(context)?,
        };
        self.variables.truncate(scope);
        self.top_level = top_level;
        Ok(Branch {
            pipeline,
            list,
            otherwise,
        })
    }

    /// What follows `{{else`: `if …` or `with …` (a structure of its own
    /// that ends with this one's `{{end}}`), or `}}` and a list up to the
    /// `{{end}}`.
    fn otherwise(&mut self, context: &'static str) -> Result<Vec<Node>, String> {
        self.skip_space();
        if let Some(Token::Identifier(word)) = self.peek()
            && (context == "if" || context == "with")
            && word == context
        {
            self.at += 1;
            let branch = self.control(context)?;
            return Ok(vec![if context == "if" {
                Node::If(branch)
            } else {
                Node::With(branch)
            }]);
        }
        self.expect_close("else")?;
        match self.list()? {
            (list, Closer::End) => Ok(list),
            (_, Closer::Else) => Err(format!("expected end; found {{{{else}}}} in {context}")),
            (_, Closer::Eof) => Err(format!("unexpected EOF in {context}")),
        }
    }

    /// A pipeline up to `end` (`}}` or `)`), with its declarations.
    fn pipeline(&mut self, context: &str, end: &Token) -> Result<Pipeline, String> {
        let mut declared = Vec::new();
        let mut assigns = false;
        loop {
            self.skip_space();
            let Some(Token::Variable(name)) = self.peek().cloned() else {
                break;
            };
            let start = self.at;
            self.at += 1;
            self.skip_space();
            match self.peek() {
                Some(Token::Declare | Token::Assign) => {
                    assigns = self.next() == Some(Token::Assign);
                    if assigns && !self.variables.contains(&name) {
                        return Err(format!("undefined variable {name:?}"));
                    }
                    declared.push(name.clone());
                    self.variables.push(name);
                    break;
                }
                Some(Token::Comma) if context == "range" && declared.is_empty() => {
                    self.at += 1;
                    declared.push(name.clone());
                    self.variables.push(name);
                }
                Some(Token::Comma) => return Err(format!("too many declarations in {context}")),
                _ if declared.is_empty() => {
                    self.at = start;
                    break;
                }
                _ => return Err("range can only initialize variables".into()),
            }
        }
        let mut commands = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(token) if token == end => {
                    self.at += 1;
                    break;
                }
                Some(Token::Close | Token::RightParen) | None => {
                    return Err(format!("unexpected {:?} in {context}", self.peek()));
                }
                Some(_) => commands.push(self.command()?),
            }
        }
        if commands.is_empty() {
            return Err(format!("missing value for {context}"));
        }
        let constant = |first: &Operand| {
            matches!(
                first,
                Operand::Bool(_) | Operand::Dot | Operand::Nil | Operand::Number(_) | Operand::Str(_)
            )
        };
        if let Some(stage) = commands.iter().skip(1).position(|command| constant(&command[0])) {
            return Err(format!("non executable command in pipeline stage {}", stage + 2));
        }
        Ok(Pipeline {
            declared,
            assigns,
            commands,
        })
    }

    /// One command: operands separated by spaces, up to `|` (taken),
    /// `}}` or `)` (left).
    fn command(&mut self) -> Result<Vec<Operand>, String> {
        let mut operands = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(Token::Close | Token::RightParen) => break,
                Some(Token::Pipe) => {
                    self.at += 1;
                    break;
                }
                _ => operands.push(self.operand()?),
            }
            if !matches!(
                self.peek(),
                Some(Token::Space | Token::Close | Token::RightParen | Token::Pipe)
            ) {
                return Err(format!("unexpected {:?} in operand", self.peek()));
            }
        }
        if operands.is_empty() {
            return Err("empty command".into());
        }
        Ok(operands)
    }

    /// A term and the fields chained to it without a space.
    fn operand(&mut self) -> Result<Operand, String> {
        let term = self.term()?;
        let mut chain = Vec::new();
        while let Some(Token::Field(name)) = self.peek() {
            chain.push(name.clone());
            self.at += 1;
        }
        if chain.is_empty() {
            return Ok(term);
        }
        Ok(match term {
            Operand::Field(mut fields) => {
                fields.extend(chain);
                Operand::Field(fields)
            }
            Operand::Variable(name, mut fields) => {
                fields.extend(chain);
                Operand::Variable(name, fields)
            }
            Operand::Pipeline(pipeline, mut fields) => {
                fields.extend(chain);
                Operand::Pipeline(pipeline, fields)
            }
            other => return Err(format!("unexpected . after term {other:?}")),
        })
    }

    fn term(&mut self) -> Result<Operand, String> {
        Ok(match self.next() {
            Some(Token::Identifier(name)) if exec::is_function(&name) => Operand::Function(name),
            Some(Token::Identifier(name)) => return Err(format!("function {name:?} not defined")),
            Some(Token::Dot) => Operand::Dot,
            Some(Token::Nil) => Operand::Nil,
            Some(Token::Bool(b)) => Operand::Bool(b),
            Some(Token::Str(s)) => Operand::Str(s),
            Some(Token::Number(text)) => Operand::Number(number(text)?),
            Some(Token::Char(c)) => Operand::Number(Number {
                text: format!("{c:?}"),
                int: Some(i64::from(u32::from(c))),
                float: Some(f64::from(u32::from(c))),
            }),
            Some(Token::Field(name)) => Operand::Field(vec![name]),
            Some(Token::Variable(name)) if self.variables.contains(&name) => Operand::Variable(name, Vec::new()),
            Some(Token::Variable(name)) => return Err(format!("undefined variable {name:?}")),
            Some(Token::LeftParen) => Operand::Pipeline(
                Box::new(self.pipeline("parenthesized pipeline", &Token::RightParen)?),
                Vec::new(),
            ),
            other => return Err(format!("unexpected {other:?} in operand")),
        })
    }
}

/// What an action turned out to be.
enum Action {
    Node(Node),
    /// A `define`: nothing where it stands.
    Defined,
    End,
    Else,
}

/// A number's values, as Go's `parse.newNumber`: an integer (decimal,
/// `0x`, `0o`, `0b`, `_` between digits) is also a float; a float with
/// an integral value is also an integer.
fn number(text: String) -> Result<Number, String> {
    let digits = text.replace('_', "");
    let (negative, unsigned) = match digits.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, digits.strip_prefix('+').unwrap_or(&digits)),
    };
    let lower = unsigned.to_ascii_lowercase();
    let radix_int = match lower.get(..2) {
        Some("0x") if !lower.contains('p') => i64::from_str_radix(&lower[2..], 16).ok(),
        Some("0o") => i64::from_str_radix(&lower[2..], 8).ok(),
        Some("0b") => i64::from_str_radix(&lower[2..], 2).ok(),
        _ if lower.len() > 1 && lower.starts_with('0') && lower.bytes().all(|b| b.is_ascii_digit()) => {
            i64::from_str_radix(&lower[1..], 8).ok()
        }
        _ => lower.parse::<i64>().ok(),
    };
    let sign = |n: i64| if negative { -n } else { n };
    if let Some(n) = radix_int {
        let n = sign(n);
        #[allow(clippy::cast_precision_loss)] // as Go's float64(int64)
        return Ok(Number {
            text,
            int: Some(n),
            float: Some(n as f64),
        });
    }
    let float = lower
        .parse::<f64>()
        .ok()
        .filter(|f| f.is_finite() && !lower.starts_with("0x") && !lower.contains("inf") && !lower.contains("nan"))
        .ok_or_else(|| format!("illegal number syntax: {text:?}"))?;
    let float = if negative { -float } else { float };
    #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)] // checked: integral and in range
    let int = (float.fract() == 0.0 && float.abs() < 9.2e18).then_some(float as i64);
    Ok(Number {
        text,
        int,
        float: Some(float),
    })
}
