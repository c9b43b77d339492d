//! The user's own parameters of a job, as part of what the job is.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The parameters a program gives its job ([`JobBuilder::params`](crate::JobBuilder::params)):
/// a generated data set's seed and size, a learning rate, a list of files — whatever
/// makes one run of the program another job than the next. They are part of the job's
/// identity: every process of the job must have the same (its handshake is refused
/// otherwise, naming the parameter), and every checkpoint records them, so that a job
/// never resumes from a checkpoint of other parameters.
///
/// Held as the serde form of the value the program gave, flattened into named fields:
/// a struct's fields by name, in the order of their names (`seed`, `model.rate` for a nested struct), a value that
/// is no struct or map as the one field `params`; each value as JSON text. Two values
/// are the same parameters when every field has the same text.
///
/// ```
/// use superstep::JobParams;
///
/// #[derive(serde::Serialize)]
/// struct Args { seed: u64, rows: usize, files: Vec<&'static str> }
///
/// let params = JobParams::of(&Args { seed: 7, rows: 1000, files: vec!["a.csv"] })?;
/// assert_eq!(params.to_string(), r#"files = ["a.csv"], rows = 1000, seed = 7"#);
/// let other = JobParams::of(&Args { seed: 8, rows: 1000, files: vec!["a.csv"] })?;
/// assert_eq!(
///     params.first_difference(&other),
///     Some(("seed".to_string(), "7".to_string(), "8".to_string()))
/// );
/// # Ok::<(), superstep::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobParams(Vec<(String, String)>);

impl JobParams {
    /// The parameters `value` holds, flattened into named fields. A value whose serde form
    /// has no JSON form (a map whose keys are not strings or numbers, say) is a
    /// [`ConfigError`](crate::error::ConfigError) naming `params`.
    pub fn of(value: &impl Serialize) -> Result<Self, crate::error::ConfigError> {
        let json = serde_json::to_value(value).map_err(|e| {
            crate::error::ConfigError::new(
                "params",
                std::any::type_name_of_val(value),
                &format!("must have a JSON form (a struct, map, list or value): {e}"),
            )
        })?;
        let mut fields = Vec::new();
        match json {
            serde_json::Value::Object(map) => flatten("", map, &mut fields),
            other => fields.push(("params".to_string(), other.to_string())),
        }
        Ok(JobParams(fields))
    }

    /// Whether the job was given no parameters.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every field and its value (JSON text), in order.
    pub fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The value of the field `name`, as JSON text.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The first field, in this value's order (then the other's), whose values differ:
    /// `(field, this value, the other's)`; a field one side lacks reads `(none)`.
    pub fn first_difference(&self, other: &JobParams) -> Option<(String, String, String)> {
        first_difference(&self.0, &other.0)
    }
}

/// A map's fields, nested maps' named `outer.inner`.
fn flatten(
    prefix: &str,
    map: serde_json::Map<String, serde_json::Value>,
    into: &mut Vec<(String, String)>,
) {
    for (name, value) in map {
        let name = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}.{name}")
        };
        match value {
            serde_json::Value::Object(inner) if !inner.is_empty() => flatten(&name, inner, into),
            other => into.push((name, other.to_string())),
        }
    }
}

/// The first field of named values, in `ours`' order (then `theirs`'), whose values
/// differ: `(field, ours, theirs)`; a field one side lacks reads `(none)`.
pub(crate) fn first_difference(
    ours: &[(String, String)],
    theirs: &[(String, String)],
) -> Option<(String, String, String)> {
    let none = "(none)";
    let get = |fields: &[(String, String)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| none.to_string())
    };
    let ours_first = ours.iter().map(|(n, v)| (n, v.clone(), get(theirs, n)));
    let theirs_only = theirs
        .iter()
        .filter(|(n, _)| !ours.iter().any(|(o, _)| o == n))
        .map(|(n, v)| (n, none.to_string(), v.clone()));
    ours_first
        .chain(theirs_only)
        .find(|(_, a, b)| a != b)
        .map(|(n, a, b)| (n.clone(), a, b))
}

impl fmt::Display for JobParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} = {value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::JobParams;

    #[derive(serde::Serialize)]
    struct Model {
        rate: f64,
        layers: Vec<u32>,
    }

    #[derive(serde::Serialize)]
    struct Args {
        seed: u64,
        model: Model,
        name: Option<String>,
    }

    #[test]
    fn a_structs_fields_are_named_nested_ones_by_their_path_in_name_order() {
        let params = JobParams::of(&Args {
            seed: 3,
            model: Model {
                rate: 0.5,
                layers: vec![2, 1],
            },
            name: None,
        })
        .unwrap();
        let fields: Vec<_> = params.fields().collect();
        assert_eq!(
            fields,
            [
                ("model.layers", "[2,1]"),
                ("model.rate", "0.5"),
                ("name", "null"),
                ("seed", "3")
            ]
        );
    }

    #[test]
    fn a_value_that_is_no_struct_is_the_one_field_params() {
        let params = JobParams::of(&(7u64, "x")).unwrap();
        assert_eq!(params.to_string(), r#"params = [7,"x"]"#);
        assert_eq!(JobParams::default().to_string(), "none");
    }

    #[test]
    fn a_field_one_side_lacks_reads_none() {
        let a = JobParams::of(&serde_json::json!({"seed": 1})).unwrap();
        let b = JobParams::of(&serde_json::json!({"seed": 1, "rows": 5})).unwrap();
        assert_eq!(
            a.first_difference(&b),
            Some(("rows".into(), "(none)".into(), "5".into()))
        );
        assert_eq!(a.first_difference(&a.clone()), None);
    }

    #[test]
    fn a_value_with_no_json_form_is_a_config_error_naming_params() {
        let mut map = std::collections::HashMap::new();
        map.insert((1u8, 2u8), 3u8);
        let err = JobParams::of(&map).unwrap_err();
        assert!(err.to_string().contains("`params`"), "{err}");
    }
}
