//! The tokenizer: a Hugging Face `tokenizer.json` (for the shipped model,
//! all-MiniLM-L6-v2's WordPiece, uncased) turned into the model's three
//! int64 inputs.
//!
//! The shipped file fixes padding to 128 and truncation at 128; both are
//! replaced here: **padding off** (a batch-1 request carries exactly its own
//! tokens, no `[PAD]`s) and **truncation at [`MAX_TOKENS`]** (512, the
//! model's position-embedding limit), the same settings the Python reference
//! vectors are made with (`tok.no_padding(); tok.enable_truncation(512)`).
//! A truncated line is flagged ([`Encoded::truncated_from`]) so the caller
//! can warn about it.

use crate::ClassifierError;
use std::path::{Path, PathBuf};
use tokenizers::{PostProcessor, Tokenizer, TruncationParams};

/// The most tokens one line may have (special tokens included); longer
/// lines are truncated.
pub const MAX_TOKENS: usize = 512;

/// One line, tokenized: the model's inputs (each `[1, len]`), and how long
/// the line was before truncation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids, `[CLS] ... [SEP]`.
    pub input_ids: Vec<i64>,
    /// 1 for every token (there is no padding).
    pub attention_mask: Vec<i64>,
    /// Segment ids (0 for a single sentence).
    pub token_type_ids: Vec<i64>,
    /// `Some(n)`: the line had `n` tokens and was truncated to
    /// [`TextTokenizer::max_tokens`]. `None`: nothing was cut.
    pub truncated_from: Option<usize>,
}

impl Encoded {
    /// Tokens in the (possibly truncated) encoding.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether there are no tokens at all (never for a tokenizer that adds
    /// special tokens).
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// The shape every input tensor has: `[1, len]` (batch 1).
    pub fn shape(&self) -> [u64; 2] {
        [1, self.len() as u64]
    }

    /// The input tensor for a model input name: `input_ids`,
    /// `attention_mask` or `token_type_ids`; `None` for any other name.
    pub fn input(&self, name: &str) -> Option<&[i64]> {
        match name {
            "input_ids" => Some(&self.input_ids),
            "attention_mask" => Some(&self.attention_mask),
            "token_type_ids" => Some(&self.token_type_ids),
            _ => None,
        }
    }
}

/// A loaded tokenizer with padding off and truncation at
/// [`max_tokens`](TextTokenizer::max_tokens).
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    /// The same tokenizer without truncation: counts the tokens of a line
    /// that was truncated (only then), for the warning.
    untruncated: Tokenizer,
    max_tokens: usize,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("path", &self.path)
            .field("max_tokens", &self.max_tokens)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads `path` (a `tokenizer.json`), truncating at [`MAX_TOKENS`].
    /// A missing, unreadable or malformed file is
    /// [`ClassifierError::Tokenizer`] naming it.
    pub fn load(path: &Path) -> Result<TextTokenizer, ClassifierError> {
        TextTokenizer::load_with_max(path, MAX_TOKENS)
    }

    /// Like [`load`](TextTokenizer::load), truncating at `max_tokens`
    /// (special tokens included; at least 2 when the tokenizer adds them).
    pub fn load_with_max(path: &Path, max_tokens: usize) -> Result<TextTokenizer, ClassifierError> {
        let err = |reason: String| ClassifierError::Tokenizer {
            path: path.display().to_string(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let mut inner = Tokenizer::from_bytes(&bytes)
            .map_err(|e| err(format!("not a valid tokenizer.json: {e}")))?;
        let added = inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max_tokens <= added {
            return Err(err(format!(
                "truncation at {max_tokens} tokens leaves no room next to the {added} special tokens"
            )));
        }
        inner.with_padding(None);
        let mut untruncated = inner.clone();
        untruncated
            .with_truncation(None)
            .map_err(|e| err(format!("cannot turn truncation off: {e}")))?;
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                ..TruncationParams::default()
            }))
            .map_err(|e| err(format!("cannot set truncation: {e}")))?;
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
            untruncated,
            max_tokens,
        })
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The most tokens an encoding has.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokenizes one line (special tokens added, no padding, truncated at
    /// [`max_tokens`](TextTokenizer::max_tokens)). `line` is the line's
    /// number, for the error message only.
    pub fn encode(&self, text: &str, line: usize) -> Result<Encoded, ClassifierError> {
        let enc = self
            .inner
            .encode_fast(text, true)
            .map_err(|e| ClassifierError::Encode {
                line,
                reason: e.to_string(),
            })?;
        let truncated_from = if enc.get_overflowing().is_empty() {
            None
        } else {
            // Rare (over-long lines only): count what was cut exactly.
            let full =
                self.untruncated
                    .encode_fast(text, true)
                    .map_err(|e| ClassifierError::Encode {
                        line,
                        reason: e.to_string(),
                    })?;
            Some(full.len())
        };
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>();
        Ok(Encoded {
            input_ids: widen(enc.get_ids()),
            attention_mask: widen(enc.get_attention_mask()),
            token_type_ids: widen(enc.get_type_ids()),
            truncated_from,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny WordPiece tokenizer.json in the shape of BERT's (lowercasing,
    /// BERT pre-tokenizer, `[CLS] A [SEP]` template), with the padding and
    /// truncation the shipped MiniLM file has, which loading must undo.
    pub(crate) fn tiny_tokenizer_json() -> String {
        let vocab = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "!", "the", "cat", "##s", "caf",
            "##e",
        ];
        let vocab: Vec<String> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| format!("\"{t}\": {i}"))
            .collect();
        format!(
            r###"{{
  "version": "1.0",
  "truncation": {{"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}},
  "padding": {{"strategy": {{"Fixed": 8}}, "direction": "Right", "pad_to_multiple_of": null,
              "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}},
  "added_tokens": [
    {{"id": 0, "special": true, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}},
    {{"id": 1, "special": true, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}},
    {{"id": 2, "special": true, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}},
    {{"id": 3, "special": true, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}}
  ],
  "normalizer": {{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                 "strip_accents": null, "lowercase": true}},
  "pre_tokenizer": {{"type": "BertPreTokenizer"}},
  "post_processor": {{"type": "TemplateProcessing",
    "single": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}},
               {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}],
    "pair": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}},
             {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}},
             {{"SpecialToken": {{"id": "[SEP]", "type_id": 1}}}}],
    "special_tokens": {{"[CLS]": {{"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}},
                       "[SEP]": {{"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}}}
  }},
  "decoder": {{"type": "WordPiece", "prefix": "##", "cleanup": true}},
  "model": {{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": {{{}}}}}
}}"###,
            vocab.join(", ")
        )
    }

    pub(crate) fn tiny_tokenizer(dir: &Path) -> PathBuf {
        let p = dir.join("tokenizer.json");
        std::fs::write(&p, tiny_tokenizer_json()).expect("write tokenizer");
        p
    }

    #[test]
    fn no_padding_and_special_tokens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tok = TextTokenizer::load(&tiny_tokenizer(dir.path())).expect("load");
        let e = tok.encode("Hello, World!", 1).expect("encode");
        // "," is not in the vocabulary.
        assert_eq!(e.input_ids, vec![2, 4, 1, 5, 6, 3]);
        assert_eq!(e.attention_mask, vec![1; 6]);
        assert_eq!(e.token_type_ids, vec![0; 6]);
        assert_eq!(e.truncated_from, None);
        assert_eq!(e.shape(), [1, 6]);
        assert_eq!(e.input("attention_mask"), Some(&e.attention_mask[..]));
        assert_eq!(e.input("pixel_values"), None);
        // Subwords; the file's own truncation at 4 is gone.
        let e = tok.encode("the cats CAFE", 2).expect("encode");
        assert_eq!(e.input_ids, vec![2, 7, 8, 9, 10, 11, 3]);
        // An empty line still gets [CLS] [SEP].
        assert_eq!(tok.encode("", 3).expect("encode").input_ids, vec![2, 3]);
    }

    #[test]
    fn truncation_is_flagged_with_the_original_length() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = tiny_tokenizer(dir.path());
        let tok = TextTokenizer::load_with_max(&path, 5).expect("load");
        assert_eq!(tok.max_tokens(), 5);
        for words in 1..12 {
            let text = vec!["cat"; words].join(" ");
            let e = tok.encode(&text, 1).expect("encode");
            let full = words + 2;
            if full <= 5 {
                assert_eq!(e.truncated_from, None, "{words} words");
                assert_eq!(e.len(), full);
            } else {
                assert_eq!(e.truncated_from, Some(full), "{words} words");
                assert_eq!(e.input_ids, vec![2, 8, 8, 8, 3], "{words} words");
            }
        }
        // Subword pieces count as tokens too.
        let e = tok.encode("cats cats cats", 1).expect("encode");
        assert_eq!(e.truncated_from, Some(8));
        assert!(TextTokenizer::load_with_max(&path, 2).is_err());
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope.json");
        let e = TextTokenizer::load(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.json") && e.contains("tokenizer"), "{e}");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, b"{\"version\": \"1.0\", \"model\": 7").expect("write");
        let e = TextTokenizer::load(&bad).unwrap_err().to_string();
        assert!(
            e.contains("bad.json") && e.contains("not a valid tokenizer.json"),
            "{e}"
        );
        std::fs::write(&bad, [0xffu8, 0xfe, 0x00]).expect("write");
        let e = TextTokenizer::load(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
    }
}
