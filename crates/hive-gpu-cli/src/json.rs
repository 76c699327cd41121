//! A flat JSON object writer: enough for the CLI's one-line reports, without a serde stack.

use std::fmt::Write;

/// One JSON value.
pub enum Value {
    Str(String),
    Int(u64),
    /// A number; NaN and infinities become `null`.
    Num(f64),
    /// `true` or `false`.
    Bool(bool),
    /// `null`: a value that was not measured.
    Null,
    /// An array of values.
    List(Vec<Value>),
}

/// Renders `fields` as one JSON object, in order.
pub fn object(fields: &[(&str, Value)]) -> String {
    let mut out = String::from("{");
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&quote(key));
        out.push(':');
        write_value(&mut out, value);
    }
    out.push('}');
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Str(s) => out.push_str(&quote(s)),
        Value::Int(n) => out.push_str(&n.to_string()),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Num(x) if x.is_finite() => out.push_str(&format!("{x}")),
        Value::Num(_) | Value::Null => out.push_str("null"),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
    }
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_orders_fields() {
        let s = object(&[
            ("name", Value::Str("a\"b\\c\n".into())),
            ("n", Value::Int(3)),
            ("x", Value::Num(0.5)),
            ("nan", Value::Num(f64::NAN)),
            ("list", Value::List(vec![Value::Str("7".into()), Value::Num(1.5), Value::Null])),
        ]);
        assert_eq!(s, r#"{"name":"a\"b\\c\n","n":3,"x":0.5,"nan":null,"list":["7",1.5,null]}"#);
    }
}
