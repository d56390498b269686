//! The classifier's label names, read from the JSON sidecar the model
//! builder writes next to the model (`tweet_classifier.onnx` →
//! `tweet_classifier.json`, field `"labels"`, in logit order).

use crate::ClassifierError;
use std::path::{Path, PathBuf};

/// Label names in the order of the model's logits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels {
    names: Vec<String>,
    path: PathBuf,
}

impl Labels {
    /// The sidecar of a model file: the same path with the extension `.json`.
    pub fn sidecar_path(model: &Path) -> PathBuf {
        model.with_extension("json")
    }

    /// Reads the labels of the model at `model` from its sidecar.
    pub fn for_model(model: &Path) -> Result<Labels, ClassifierError> {
        Labels::load(&Labels::sidecar_path(model))
    }

    /// Reads the `"labels"` list (non-empty, of strings) of the JSON object
    /// in `path`. Errors name the file.
    pub fn load(path: &Path) -> Result<Labels, ClassifierError> {
        let err = |reason: String| ClassifierError::Labels {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let list = v
            .get("labels")
            .ok_or_else(|| err("no \"labels\" field".into()))?
            .as_array()
            .ok_or_else(|| err("\"labels\" is not a list".into()))?;
        let names = list
            .iter()
            .enumerate()
            .map(|(i, l)| {
                l.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err(format!("label {i} is not a string: {l}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Labels::new(names, path.to_path_buf())
    }

    /// Labels from a list (`path` only names where they came from).
    pub fn new(names: Vec<String>, path: PathBuf) -> Result<Labels, ClassifierError> {
        if names.is_empty() {
            return Err(ClassifierError::Labels {
                path: path.display().to_string(),
                reason: "\"labels\" is empty".into(),
            });
        }
        Ok(Labels { names, path })
    }

    /// The file they were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All names, in logit order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many labels (= logits per line).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Never true (a `Labels` has at least one name).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of label `i` (`"?"` past the end).
    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map_or("?", String::as_str)
    }
}

/// The index of the largest logit (the first one on a tie, as NumPy's
/// `argmax`); `None` for an empty slice. NaNs never win unless every logit
/// is NaN (then 0).
pub fn argmax(logits: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        match best {
            None => best = Some((i, v)),
            Some((_, b)) if v > b || (b.is_nan() && !v.is_nan()) => best = Some((i, v)),
            _ => {}
        }
    }
    best.map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sidecar() {
        let dir = tempfile::tempdir().expect("tempdir");
        let model = dir.path().join("m.onnx");
        std::fs::write(
            dir.path().join("m.json"),
            r#"{"labels": ["offensive-language", "hate-speech", "neither"], "max_len": 512}"#,
        )
        .expect("write");
        let l = Labels::for_model(&model).expect("labels");
        assert_eq!(l.len(), 3);
        assert_eq!(l.name(2), "neither");
        assert_eq!(l.name(3), "?");
        assert_eq!(l.path(), dir.path().join("m.json"));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("side.json");
        let e = Labels::load(&p).unwrap_err().to_string();
        assert!(e.contains("side.json"), "{e}");
        for (body, needle) in [
            ("{", "not valid JSON"),
            ("{}", "no \"labels\""),
            (r#"{"labels": "a"}"#, "not a list"),
            (r#"{"labels": ["a", 3]}"#, "label 1 is not a string"),
            (r#"{"labels": []}"#, "empty"),
        ] {
            std::fs::write(&p, body).expect("write");
            let e = Labels::load(&p).unwrap_err().to_string();
            assert!(e.contains("side.json") && e.contains(needle), "{body}: {e}");
        }
    }

    #[test]
    fn argmax_is_first_max() {
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, -1.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.2]), Some(1));
        assert_eq!(argmax(&[0.1, f32::NAN, 0.2]), Some(2));
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), Some(0));
    }
}
