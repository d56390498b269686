//! Bodies of control messages, carried in the descriptor section.
//!
//! ```text
//! Hello / HelloAck (32 bytes, then a Hello's token)
//!  0 4 max_tensors   u32     0 in a Hello = no preference
//!  4 4 max_in_flight u32
//!  8 8 max_payload   u64
//! 16 4 max_desc_len  u32
//! 20 2 token_len     u16     Hello only: bytes of bearer token after the body
//!                            (0 = none); always 0 in a HelloAck
//! 22 10 reserved     zero
//! 32 token_len token        Hello only: the bearer token, 1..=1024 bytes
//!
//! ModelQuery: the model name, UTF-8, 1..=255 bytes, no terminator.
//!
//! ModelInfo: one signature (header.model_id = the model's id)
//! signature = name_len u16, name, n_inputs u16, n_outputs u16, specs...
//! spec      = name_len u16, name, dtype u8, ndim u8, dims: ndim × i64 (-1 = dynamic)
//!
//! ModelList: count u32, then per model: model_id u32, signature
//!
//! Error: UTF-8 message, at most 4096 bytes (header.status = the code)
//! ```

use crate::dtype::DType;
use crate::error::{need, WireError};
use crate::limits::Limits;
use crate::tensor::MAX_DIMS;

/// Longest model or tensor name, in bytes.
///
/// # Examples
///
/// ```
/// use wire::{decode_model_name, MAX_NAME_LEN};
/// assert!(decode_model_name("m".repeat(MAX_NAME_LEN).as_bytes()).is_ok());
/// assert!(decode_model_name("m".repeat(MAX_NAME_LEN + 1).as_bytes()).is_err());
/// ```
pub const MAX_NAME_LEN: usize = 255;
/// Longest error message, in bytes.
///
/// # Examples
///
/// ```
/// use wire::{decode_error_body, encode_error_body, MAX_ERROR_MESSAGE};
/// assert_eq!(encode_error_body(&"e".repeat(MAX_ERROR_MESSAGE + 10)).len(), MAX_ERROR_MESSAGE);
/// assert!(decode_error_body(&vec![b'e'; MAX_ERROR_MESSAGE + 1]).is_err());
/// ```
pub const MAX_ERROR_MESSAGE: usize = 4096;
/// Most inputs or outputs a signature may list.
const MAX_SPECS: usize = 1024;

/// The body of Hello and HelloAck: session limits.
pub type HelloBody = Limits;

/// Longest bearer token a Hello may carry, in bytes.
///
/// Example: [`check_token`].
pub const MAX_TOKEN_LEN: usize = 1024;

/// What a client says in its Hello: the limits it asks for, and the bearer
/// token that names its tenant, if it has one. (`Debug` shows the token's
/// length, never its bytes.)
///
/// # Examples
///
/// ```
/// use wire::{decode_hello_request, encode_hello_with_token, Limits};
/// let body = encode_hello_with_token(&Limits::default(), Some(b"tenant-token"));
/// let hello = decode_hello_request(&body)?;
/// assert_eq!(hello.token, Some(&b"tenant-token"[..]));
/// assert!(!format!("{hello:?}").contains("tenant-token")); // Debug hides it
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The limits asked for (0 fields = no preference).
    pub limits: Limits,
    /// The bearer token, 1..=[`MAX_TOKEN_LEN`] bytes.
    pub token: Option<&'a [u8]>,
    /// The sender relays a client it could not identify
    /// ([`HELLO_ANONYMOUS`]): the agent must not know the session by the
    /// sender's own credentials.
    pub anonymous: bool,
}

/// Hello flag (body byte 22): the session is relayed for a client the
/// sender (a gateway) could not identify, so the agent must identify it
/// by its token only, never by the relaying process's credentials (its
/// uid over `unix://` or `shm://`): a tokenless relayed session is the
/// `default` tenant's, as a tokenless tcp client's is.
///
/// # Examples
///
/// ```
/// use wire::{decode_hello_request, encode_hello_as, Limits, HELLO_ANONYMOUS};
/// let body = encode_hello_as(&Limits::default(), None, true);
/// assert_eq!(body[22], HELLO_ANONYMOUS);
/// assert!(decode_hello_request(&body)?.anonymous);
/// # Ok::<(), wire::WireError>(())
/// ```
pub const HELLO_ANONYMOUS: u8 = 1;

impl std::fmt::Debug for Hello<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hello")
            .field("limits", &self.limits)
            .field("token_len", &self.token.map(<[u8]>::len))
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

/// Encodes a HelloAck body, or a Hello body without a token.
///
/// # Examples
///
/// ```
/// use wire::{decode_hello, encode_hello, Limits};
/// let ack = encode_hello(&Limits::default()); // the agent's HelloAck body
/// assert_eq!(ack.len(), 32);
/// assert_eq!(decode_hello(&ack)?, Limits::default());
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_hello(l: &Limits) -> Vec<u8> {
    encode_hello_with_token(l, None)
}

/// Encodes a Hello body carrying `token` (empty = none). A token longer
/// than [`MAX_TOKEN_LEN`] is the caller's bug: check it with
/// [`check_token`] first (it would be refused by the agent).
///
/// # Examples
///
/// ```
/// use wire::{check_token, decode_hello_request, encode_hello_with_token, Limits};
/// let token = b"s3cret";
/// check_token(token)?;
/// let body = encode_hello_with_token(&Limits::default(), Some(token));
/// assert_eq!(body.len(), 32 + token.len());
/// assert_eq!(decode_hello_request(&body)?.token, Some(&token[..]));
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_hello_with_token(l: &Limits, token: Option<&[u8]>) -> Vec<u8> {
    encode_hello_as(l, token, false)
}

/// Encodes a Hello body carrying `token`, marked [`HELLO_ANONYMOUS`] when
/// `anonymous` (a relay speaking for a client it could not identify).
///
/// # Examples
///
/// ```
/// use wire::{decode_hello_request, encode_hello_as, Limits};
/// // A gateway relaying a client it could not identify.
/// let body = encode_hello_as(&Limits::default(), None, true);
/// let hello = decode_hello_request(&body)?;
/// assert!(hello.anonymous && hello.token.is_none());
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_hello_as(l: &Limits, token: Option<&[u8]>, anonymous: bool) -> Vec<u8> {
    let token = token.unwrap_or_default();
    let token = &token[..token.len().min(MAX_TOKEN_LEN)];
    let mut b = Vec::with_capacity(32 + token.len());
    b.extend_from_slice(&l.max_tensors.to_le_bytes());
    b.extend_from_slice(&l.max_in_flight.to_le_bytes());
    b.extend_from_slice(&l.max_payload.to_le_bytes());
    b.extend_from_slice(&l.max_desc_len.to_le_bytes());
    b.extend_from_slice(&(token.len() as u16).to_le_bytes());
    b.push(if anonymous { HELLO_ANONYMOUS } else { 0 });
    b.extend_from_slice(&[0; 9]);
    b.extend_from_slice(token);
    b
}

/// Checks a bearer token before it is sent: 1..=[`MAX_TOKEN_LEN`] bytes.
///
/// # Examples
///
/// ```
/// use wire::{check_token, MAX_TOKEN_LEN};
/// assert!(check_token(b"abc").is_ok());
/// assert!(check_token(b"").is_err());
/// assert!(check_token(&vec![b'x'; MAX_TOKEN_LEN + 1]).is_err());
/// ```
pub fn check_token(token: &[u8]) -> Result<(), WireError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Err(WireError::malformed(format!(
            "a token is 1..={MAX_TOKEN_LEN} bytes, this one {}",
            token.len()
        )));
    }
    Ok(())
}

/// Decodes a HelloAck body (exactly 32 bytes, no token).
///
/// # Examples
///
/// ```
/// use wire::{decode_hello, encode_hello, encode_hello_with_token, Limits};
/// let limits = Limits { max_in_flight: 4, ..Limits::default() };
/// assert_eq!(decode_hello(&encode_hello(&limits))?, limits);
/// // A HelloAck never carries a token.
/// assert!(decode_hello(&encode_hello_with_token(&limits, Some(b"t"))).is_err());
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_hello(b: &[u8]) -> Result<Limits, WireError> {
    let hello = decode_hello_request(b)?;
    if hello.token.is_some() {
        return Err(WireError::malformed("a HelloAck carries no token"));
    }
    if hello.anonymous {
        return Err(WireError::malformed("a HelloAck carries no flags"));
    }
    Ok(hello.limits)
}

/// Decodes a Hello body: 32 bytes, then the token its `token_len` counts.
///
/// # Examples
///
/// ```
/// use wire::{decode_hello_request, encode_hello, Limits};
/// let body = encode_hello(&Limits::default());
/// let hello = decode_hello_request(&body)?;
/// assert_eq!((hello.limits, hello.token, hello.anonymous), (Limits::default(), None, false));
/// assert!(decode_hello_request(&[0; 16]).is_err()); // shorter than 32 bytes
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_hello_request(b: &[u8]) -> Result<Hello<'_>, WireError> {
    if b.len() < 32 {
        return Err(WireError::malformed(format!(
            "hello body is {} bytes, not 32",
            b.len()
        )));
    }
    if b[22] & !HELLO_ANONYMOUS != 0 {
        return Err(WireError::malformed(format!(
            "hello flags 0x{:02x}: only 0x{HELLO_ANONYMOUS:02x} (anonymous) is defined",
            b[22]
        )));
    }
    if b[23..32].iter().any(|&x| x != 0) {
        return Err(WireError::malformed("hello reserved bytes not zero"));
    }
    let mut r = Reader::new(b);
    let limits = Limits {
        max_tensors: r.u32()?,
        max_in_flight: r.u32()?,
        max_payload: r.u64()?,
        max_desc_len: r.u32()?,
    };
    let token_len = r.u16()? as usize;
    if b.len() != 32 + token_len {
        return Err(WireError::malformed(format!(
            "hello body is {} bytes; 32 and a {token_len}-byte token make {}",
            b.len(),
            32 + token_len
        )));
    }
    let token = (token_len > 0).then(|| &b[32..]);
    if let Some(t) = token {
        check_token(t)?;
    }
    Ok(Hello {
        limits,
        token,
        anonymous: b[22] & HELLO_ANONYMOUS != 0,
    })
}

/// Encodes a model name for ModelQuery.
///
/// # Examples
///
/// ```
/// use wire::{decode_model_name, encode_model_name};
/// let body = encode_model_name("digits"); // a ModelQuery's body
/// assert_eq!(body, b"digits");
/// assert_eq!(decode_model_name(&body)?, "digits");
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_model_name(name: &str) -> Vec<u8> {
    name.as_bytes().to_vec()
}

/// Decodes a ModelQuery body: a 1..=255 byte UTF-8 name.
///
/// # Examples
///
/// ```
/// use wire::decode_model_name;
/// assert_eq!(decode_model_name(b"resnet50")?, "resnet50");
/// assert!(decode_model_name(b"").is_err());
/// assert!(decode_model_name(&[0xff, 0xfe]).is_err()); // not UTF-8
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_model_name(b: &[u8]) -> Result<&str, WireError> {
    if b.is_empty() || b.len() > MAX_NAME_LEN {
        return Err(WireError::malformed(format!(
            "model name is {} bytes, must be 1..={MAX_NAME_LEN}",
            b.len()
        )));
    }
    std::str::from_utf8(b).map_err(|_| WireError::malformed("model name is not UTF-8"))
}

/// Encodes an Error body, truncating the message to [`MAX_ERROR_MESSAGE`]
/// bytes on a character boundary.
///
/// # Examples
///
/// ```
/// use wire::{decode_error_body, encode_error_body, MAX_ERROR_MESSAGE};
/// let body = encode_error_body("unknown model 'x'");
/// assert_eq!(decode_error_body(&body)?, "unknown model 'x'");
/// // Long messages are cut to the limit.
/// assert!(encode_error_body(&"e".repeat(10_000)).len() <= MAX_ERROR_MESSAGE);
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_error_body(message: &str) -> Vec<u8> {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.as_bytes()[..end].to_vec()
}

/// Decodes an Error body; invalid UTF-8 is replaced, not rejected, so the
/// code is never lost to a bad message.
///
/// # Examples
///
/// ```
/// use wire::decode_error_body;
/// assert_eq!(decode_error_body(b"model busy")?, "model busy");
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_error_body(b: &[u8]) -> Result<String, WireError> {
    if b.len() > MAX_ERROR_MESSAGE {
        return Err(WireError::malformed("error message longer than 4096 bytes"));
    }
    Ok(String::from_utf8_lossy(b).into_owned())
}

/// One input or output of a model.
///
/// # Examples
///
/// ```
/// use wire::{DType, TensorSpec};
/// let image = TensorSpec {
///     name: "pixels".into(),
///     dtype: DType::F32,
///     shape: vec![None, Some(3), Some(224), Some(224)],
/// };
/// assert_eq!(image.describe(), "float32[?, 3, 224, 224]");
/// assert!(image.accepts(DType::F32, &[8, 3, 224, 224]));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name as the model declares it.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions; `None` is a dynamic dimension (any size).
    pub shape: Vec<Option<u64>>,
}

impl TensorSpec {
    /// Whether a tensor of `dtype` and `shape` fits this spec.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{DType, TensorSpec};
    /// let x = TensorSpec { name: "x".into(), dtype: DType::F32, shape: vec![None, Some(64)] };
    /// assert!(x.accepts(DType::F32, &[1, 64]));
    /// assert!(x.accepts(DType::F32, &[32, 64])); // any batch
    /// assert!(!x.accepts(DType::F32, &[1, 63]));
    /// assert!(!x.accepts(DType::F64, &[1, 64]));
    /// assert!(!x.accepts(DType::F32, &[64]));
    /// ```
    pub fn accepts(&self, dtype: DType, shape: &[u64]) -> bool {
        dtype == self.dtype
            && shape.len() == self.shape.len()
            && shape
                .iter()
                .zip(&self.shape)
                .all(|(&d, s)| s.is_none_or(|s| s == d))
    }

    /// The shape as text, `?` for dynamic dims: `float32[?, 3, 224, 224]`.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{DType, TensorSpec};
    /// let ids = TensorSpec { name: "input_ids".into(), dtype: DType::I64, shape: vec![Some(1), None] };
    /// assert_eq!(ids.describe(), "int64[1, ?]");
    /// ```
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .iter()
            .map(|d| d.map_or("?".to_string(), |d| d.to_string()))
            .collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }
}

/// A model's name and its inputs and outputs.
///
/// # Examples
///
/// ```
/// use wire::{decode_signature, encode_signature, DType, ModelSignature, TensorSpec};
/// let sig = ModelSignature {
///     name: "digits".into(),
///     inputs: vec![TensorSpec { name: "x".into(), dtype: DType::F32, shape: vec![None, Some(64)] }],
///     outputs: vec![TensorSpec { name: "logits".into(), dtype: DType::F32, shape: vec![None, Some(10)] }],
/// };
/// let mut body = Vec::new();
/// encode_signature(&sig, &mut body); // a ModelInfo message's body
/// assert_eq!(decode_signature(&body)?, sig);
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSignature {
    /// Model name.
    pub name: String,
    /// Inputs in the order requests carry them.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in the order responses carry them.
    pub outputs: Vec<TensorSpec>,
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    // Truncate on a character boundary: cutting a multi-byte character in
    // half would make the whole signature undecodable.
    let mut end = name.len().min(MAX_NAME_LEN);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let n = &name.as_bytes()[..end];
    out.extend_from_slice(&(n.len() as u16).to_le_bytes());
    out.extend_from_slice(n);
}

impl ModelSignature {
    /// Checks tensors (dtype and shape, in order) against the inputs: their
    /// count, and each one's dtype and shape. The error names the first
    /// offending tensor and what the model expects. The one check every
    /// layer (client, agent, engine) uses.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{DType, ModelSignature, TensorSpec};
    /// let sig = ModelSignature {
    ///     name: "digits".into(),
    ///     inputs: vec![TensorSpec { name: "x".into(), dtype: DType::F32, shape: vec![None, Some(64)] }],
    ///     outputs: vec![],
    /// };
    /// let ok: [(DType, &[u64]); 1] = [(DType::F32, &[4, 64])];
    /// assert!(sig.check_inputs(ok.into_iter()).is_ok());
    /// let bad: [(DType, &[u64]); 1] = [(DType::F32, &[4, 65])];
    /// let why = sig.check_inputs(bad.into_iter()).unwrap_err();
    /// assert_eq!(why, "model 'digits' input 'x' must be float32[?, 64], got float32[4, 65]");
    /// let none: [(DType, &[u64]); 0] = [];
    /// assert!(sig.check_inputs(none.into_iter()).is_err()); // wrong count
    /// ```
    pub fn check_inputs<'a>(
        &self,
        inputs: impl ExactSizeIterator<Item = (DType, &'a [u64])>,
    ) -> Result<(), String> {
        if inputs.len() != self.inputs.len() {
            return Err(format!(
                "model '{}' takes {} inputs, got {}",
                self.name,
                self.inputs.len(),
                inputs.len()
            ));
        }
        for (spec, (dtype, shape)) in self.inputs.iter().zip(inputs) {
            if !spec.accepts(dtype, shape) {
                return Err(format!(
                    "model '{}' input '{}' must be {}, got {dtype}{shape:?}",
                    self.name,
                    spec.name,
                    spec.describe(),
                ));
            }
        }
        Ok(())
    }
}

/// Appends a signature's encoding to `out`.
///
/// # Examples
///
/// ```
/// use wire::{decode_signature, encode_signature, DType, ModelSignature, TensorSpec};
/// let sig = ModelSignature {
///     name: "echo".into(),
///     inputs: vec![TensorSpec { name: "in".into(), dtype: DType::U8, shape: vec![None] }],
///     outputs: vec![TensorSpec { name: "out".into(), dtype: DType::U8, shape: vec![None] }],
/// };
/// let mut body = Vec::new();
/// encode_signature(&sig, &mut body);
/// assert_eq!(decode_signature(&body)?, sig);
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_signature(sig: &ModelSignature, out: &mut Vec<u8>) {
    put_name(out, &sig.name);
    out.extend_from_slice(&(sig.inputs.len() as u16).to_le_bytes());
    out.extend_from_slice(&(sig.outputs.len() as u16).to_le_bytes());
    for spec in sig.inputs.iter().chain(&sig.outputs) {
        put_name(out, &spec.name);
        out.push(spec.dtype.code());
        out.push(spec.shape.len() as u8);
        for d in &spec.shape {
            let v: i64 = d.map_or(-1, |d| d as i64);
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Decodes one signature (a whole ModelInfo body).
///
/// # Examples
///
/// ```
/// use wire::{decode_signature, encode_signature, ModelSignature};
/// let sig = ModelSignature { name: "m".into(), inputs: vec![], outputs: vec![] };
/// let mut body = Vec::new();
/// encode_signature(&sig, &mut body);
/// assert_eq!(decode_signature(&body)?, sig);
/// assert!(decode_signature(&body[..body.len() - 1]).is_err()); // truncated
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_signature(b: &[u8]) -> Result<ModelSignature, WireError> {
    let mut r = Reader::new(b);
    let sig = r.signature()?;
    r.finish()?;
    Ok(sig)
}

/// Encodes a ModelList body.
///
/// # Examples
///
/// ```
/// use wire::{decode_model_list, encode_model_list, ModelSignature};
/// let a = ModelSignature { name: "a".into(), inputs: vec![], outputs: vec![] };
/// let b = ModelSignature { name: "b".into(), inputs: vec![], outputs: vec![] };
/// let body = encode_model_list(&[(1, a.clone()), (2, b.clone())]);
/// assert_eq!(decode_model_list(&body)?, [(1, a), (2, b)]);
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn encode_model_list(models: &[(u32, ModelSignature)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(models.len() as u32).to_le_bytes());
    for (id, sig) in models {
        out.extend_from_slice(&id.to_le_bytes());
        encode_signature(sig, &mut out);
    }
    out
}

/// Decodes a ModelList body.
///
/// # Examples
///
/// ```
/// use wire::{decode_model_list, encode_model_list};
/// assert!(decode_model_list(&encode_model_list(&[]))?.is_empty());
/// assert!(decode_model_list(&[1, 0]).is_err()); // truncated count
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_model_list(b: &[u8]) -> Result<Vec<(u32, ModelSignature)>, WireError> {
    let mut r = Reader::new(b);
    let count = r.u32()? as usize;
    // Every entry needs at least 10 bytes: refuse counts the body cannot hold.
    if count.saturating_mul(10) > b.len() {
        return Err(WireError::malformed(format!(
            "model list claims {count} models"
        )));
    }
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let id = r.u32()?;
        out.push((id, r.signature()?));
    }
    r.finish()?;
    Ok(out)
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Self {
        Reader { b, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        need(what, &self.b[self.pos..], n)?;
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1, "u8")?[0])
    }

    fn u16(&mut self) -> Result<u16, WireError> {
        let s = self.take(2, "u16")?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let s = self.take(4, "u32")?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, "u64")?);
        Ok(u64::from_le_bytes(a))
    }

    fn name(&mut self) -> Result<String, WireError> {
        let n = self.u16()? as usize;
        if n > MAX_NAME_LEN {
            return Err(WireError::malformed(format!(
                "name of {n} bytes, at most {MAX_NAME_LEN}"
            )));
        }
        let s = self.take(n, "name")?;
        String::from_utf8(s.to_vec()).map_err(|_| WireError::malformed("name is not UTF-8"))
    }

    fn spec(&mut self) -> Result<TensorSpec, WireError> {
        let name = self.name()?;
        let dtype = DType::from_code(self.u8()?)?;
        let ndim = self.u8()? as usize;
        if ndim > MAX_DIMS {
            return Err(WireError::malformed(format!(
                "{ndim} dims, at most {MAX_DIMS}"
            )));
        }
        let mut shape = Vec::with_capacity(ndim);
        for _ in 0..ndim {
            let d = self.u64()? as i64;
            shape.push(match d {
                -1 => None,
                d if d >= 0 => Some(d as u64),
                d => return Err(WireError::malformed(format!("dimension {d} is negative"))),
            });
        }
        Ok(TensorSpec { name, dtype, shape })
    }

    fn signature(&mut self) -> Result<ModelSignature, WireError> {
        let name = self.name()?;
        let n_in = self.u16()? as usize;
        let n_out = self.u16()? as usize;
        if n_in + n_out > MAX_SPECS {
            return Err(WireError::malformed("signature lists too many tensors"));
        }
        let inputs = (0..n_in).map(|_| self.spec()).collect::<Result<_, _>>()?;
        let outputs = (0..n_out).map(|_| self.spec()).collect::<Result<_, _>>()?;
        Ok(ModelSignature {
            name,
            inputs,
            outputs,
        })
    }

    fn finish(&self) -> Result<(), WireError> {
        if self.pos != self.b.len() {
            return Err(WireError::malformed(format!(
                "{} trailing bytes",
                self.b.len() - self.pos
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_anonymous_hello_flag_round_trips_and_others_are_refused() {
        let l = Limits::default();
        let b = encode_hello_as(&l, Some(b"tok"), true);
        assert_eq!(b[22], HELLO_ANONYMOUS);
        let h = decode_hello_request(&b).expect("valid");
        assert!(h.anonymous);
        assert_eq!(h.token, Some(&b"tok"[..]));
        assert!(
            !decode_hello_request(&encode_hello(&l))
                .expect("valid")
                .anonymous
        );
        let mut bad = b.clone();
        bad[22] = 2;
        assert!(decode_hello_request(&bad).is_err(), "unknown flag");
        let mut bad = b.clone();
        bad[23] = 1;
        assert!(decode_hello_request(&bad).is_err(), "reserved byte");
        let mut ack = encode_hello(&l);
        ack[22] = HELLO_ANONYMOUS;
        assert!(decode_hello(&ack).is_err(), "a HelloAck carries no flags");
    }

    use super::*;

    fn sig() -> ModelSignature {
        ModelSignature {
            name: "mlp".into(),
            inputs: vec![TensorSpec {
                name: "x".into(),
                dtype: DType::F32,
                shape: vec![None, Some(64)],
            }],
            outputs: vec![TensorSpec {
                name: "logits".into(),
                dtype: DType::F32,
                shape: vec![None, Some(10)],
            }],
        }
    }

    #[test]
    fn hello_round_trip() {
        let l = Limits::default();
        assert_eq!(decode_hello(&encode_hello(&l)).unwrap(), l);
        assert!(decode_hello(&[0; 31]).is_err());
        let body = encode_hello(&l);
        let plain = decode_hello_request(&body).unwrap();
        assert_eq!((plain.limits, plain.token), (l, None));
    }

    #[test]
    fn a_hello_carries_its_token_after_the_body() {
        let l = Limits::default();
        let b = encode_hello_with_token(&l, Some(b"s3cret"));
        assert_eq!(b.len(), 38);
        assert_eq!(&b[20..22], &6u16.to_le_bytes());
        let h = decode_hello_request(&b).unwrap();
        assert_eq!((h.limits, h.token), (l, Some(&b"s3cret"[..])));
        // An ack never carries one.
        assert!(decode_hello(&b)
            .unwrap_err()
            .to_string()
            .contains("no token"));
        // The count must match what follows, both ways.
        assert!(decode_hello_request(&b[..37]).is_err());
        let mut longer = b.clone();
        longer.push(0);
        assert!(decode_hello_request(&longer).is_err());
        // Reserved bytes after token_len stay zero.
        let mut r = b.clone();
        r[25] = 1;
        assert!(decode_hello_request(&r).is_err());
        // Too long a token is refused by its reader.
        let mut long = encode_hello(&l);
        long[20..22].copy_from_slice(&((MAX_TOKEN_LEN + 1) as u16).to_le_bytes());
        long.extend(std::iter::repeat_n(b'a', MAX_TOKEN_LEN + 1));
        assert!(decode_hello_request(&long).is_err());
        assert!(check_token(b"").is_err() && check_token(b"t").is_ok());
    }

    #[test]
    fn signature_and_list_round_trip() {
        let mut b = Vec::new();
        encode_signature(&sig(), &mut b);
        assert_eq!(decode_signature(&b).unwrap(), sig());
        let list = vec![(0, sig()), (3, sig())];
        assert_eq!(decode_model_list(&encode_model_list(&list)).unwrap(), list);
        assert!(decode_model_list(&[255, 255, 255, 255]).is_err());
        assert!(decode_signature(&b[..b.len() - 1]).is_err());
    }

    #[test]
    fn long_names_truncate_to_decodable_utf8() {
        let mut s = sig();
        s.name = "é".repeat(200); // 400 bytes; byte 255 is inside a character
        let mut b = Vec::new();
        encode_signature(&s, &mut b);
        let back = decode_signature(&b).unwrap();
        assert_eq!(back.name, "é".repeat(127));
    }

    #[test]
    fn spec_accepts() {
        let s = &sig().inputs[0];
        assert!(s.accepts(DType::F32, &[5, 64]));
        assert!(!s.accepts(DType::F32, &[5, 63]));
        assert!(!s.accepts(DType::F64, &[5, 64]));
        assert!(!s.accepts(DType::F32, &[64]));
        assert_eq!(s.describe(), "float32[?, 64]");
    }

    #[test]
    fn names_checked() {
        assert!(decode_model_name(b"").is_err());
        assert!(decode_model_name(&[0xff]).is_err());
        assert!(decode_model_name(&[b'a'; 256]).is_err());
        assert_eq!(decode_model_name(b"identity").unwrap(), "identity");
        let long = "é".repeat(3000);
        let body = encode_error_body(&long);
        assert!(body.len() <= MAX_ERROR_MESSAGE);
        assert!(std::str::from_utf8(&body).is_ok());
    }
}
