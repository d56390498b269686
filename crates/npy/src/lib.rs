//! Tensors in and out of NumPy `.npy` files.
//!
//! This crate is how real tensors get into tensorwire and results get out:
//! `tensorwire infer` reads its inputs from `.npy` files and writes its
//! outputs as `.npy` files, and `tensorwire bench` can send inputs read from
//! `.npy` files instead of generated ones. It is its own crate so that both
//! the command (`tensorwire-cli`) and the benchmark harness
//! (`tensorwire-bench`) can use it; it depends only on `wire` (for
//! [`wire::DType`] and [`wire::AlignedBuf`]) and does no other I/O.
//!
//! The crate owns the `.npy` format (versions 1.0, 2.0 and 3.0) for plain,
//! C-ordered, little-endian arrays of the dtypes tensorwire knows
//! ([`wire::DType`]), except bfloat16, which NumPy has no standard code for.
//! Everything in a file is checked before it is trusted: the magic and
//! version, the header length (at most [`MAX_HEADER_LEN`]), the header
//! dictionary (parsed strictly as the tiny Python literal NumPy writes — never
//! evaluated), the shape (at most [`MAX_NDIM`] dimensions, element and byte
//! counts that do not overflow), and the data length, which must match the
//! header exactly. Every error names the file.
//!
//! Files are written exactly as NumPy 2 writes them (same header text and
//! padding, data starting on a 64-byte boundary), so `numpy.load` reads them
//! and a byte-for-byte comparison with NumPy's own output holds.
//!
//! Why this is not a maintained crate: the two that read `.npy` headers,
//! `ndarray-npy` 0.10 and `npyz` 0.8, both parse the header dictionary with
//! `py_literal`, whose grammar backtracks exponentially on nested brackets.
//! Measured on 2026-11-27 (`ndarray_npy::npy::header::Header::from_reader`,
//! debug build): a header whose `descr` is 15 nested `[` took 8 s to parse,
//! 18 took 75 s, so a 100-byte file from outside can hold a reader for
//! hours. This crate's parser accepts only the tiny literal NumPy writes and
//! is linear in the header length (bounded by [`MAX_HEADER_LEN`]); the test
//! `nested_brackets_are_refused_at_once` keeps it so.
//!
//! # Examples
//!
//! Outputs saved for NumPy, and read back:
//!
//! ```
//! use npy::{read_npy, write_npy};
//! use wire::DType;
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("out.npy");
//! let logits = [0.5f32, -1.0, 2.0];
//! let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
//! write_npy(&path, DType::F32, &[1, 3], &bytes)?;
//!
//! let a = read_npy(&path)?;
//! assert_eq!((a.dtype, a.shape.as_slice()), (DType::F32, &[1, 3][..]));
//! assert_eq!(&a.data[..], &bytes[..]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use wire::{AlignedBuf, DType};

/// The six bytes every `.npy` file starts with.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The largest header (the dictionary text and its padding) accepted on read.
///
/// # Examples
///
/// ```
/// use npy::{read_npy, NpyError, MAX_HEADER_LEN};
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("big-header.npy");
/// // A version 2.0 header that claims to be longer than MAX_HEADER_LEN.
/// let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
/// bytes.extend_from_slice(&(MAX_HEADER_LEN as u32 + 64).to_le_bytes());
/// std::fs::write(&path, &bytes)?;
/// assert!(matches!(read_npy(&path), Err(NpyError::Invalid { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_HEADER_LEN: usize = 64 * 1024;

/// The most dimensions accepted (NumPy's own limit, `NPY_MAXDIMS`).
///
/// # Examples
///
/// ```
/// use npy::{write_npy, NpyError, MAX_NDIM};
/// use wire::DType;
/// let dir = tempfile::tempdir()?;
/// let shape = vec![1u64; MAX_NDIM + 1];
/// let r = write_npy(&dir.path().join("deep.npy"), DType::U8, &shape, &[0]);
/// assert!(matches!(r, Err(NpyError::Unsupported { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const MAX_NDIM: usize = 64;

/// NumPy aligns the start of the data to this many bytes.
const ARRAY_ALIGN: usize = 64;

/// NumPy pads the header with this many characters minus the width of the
/// first dimension, so the file can grow in place.
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// An array read from a `.npy` file.
///
/// # Examples
///
/// ```
/// use npy::{read_npy, write_npy};
/// use wire::DType;
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("scalar.npy");
/// write_npy(&path, DType::F64, &[], &2.5f64.to_le_bytes())?;
/// let a = read_npy(&path)?;
/// assert_eq!((a.dtype, a.shape.len(), a.data.len()), (DType::F64, 0, 8));
/// assert_eq!(a.data.as_ptr() as usize % 64, 0); // aligned, ready to send
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct NpyArray {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first (C order); empty for a 0-d (scalar) array.
    pub shape: Vec<u64>,
    /// The elements, little-endian, C order, exactly
    /// `product(shape) * dtype.size()` bytes, 64-byte aligned.
    pub data: AlignedBuf,
}

/// Why a `.npy` file could not be read or written. Every variant names the file.
///
/// # Examples
///
/// ```
/// use npy::{read_npy, NpyError};
/// let dir = tempfile::tempdir()?;
/// let missing = dir.path().join("missing.npy");
/// match read_npy(&missing) {
///     Err(e @ NpyError::Io { .. }) => assert!(e.to_string().contains("missing.npy")),
///     other => panic!("expected an I/O error, got {other:?}"),
/// }
/// let text = dir.path().join("not-numpy.npy");
/// std::fs::write(&text, "hello")?;
/// assert!(matches!(read_npy(&text), Err(NpyError::Invalid { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file could not be opened, read, created or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The file is not a well-formed `.npy` file (bad magic, malformed header,
    /// data too short or followed by trailing bytes, ...), or the data given to
    /// [`write_npy`] does not match its dtype and shape.
    #[error("{}: invalid .npy: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is well formed but uses something this reader does not
    /// support (Fortran order, big-endian data, structured or object dtypes,
    /// bfloat16, ...).
    #[error("{}: unsupported .npy: {reason}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What is not supported.
        reason: String,
    },
}

impl NpyError {
    fn io(path: &Path, source: io::Error) -> NpyError {
        NpyError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn invalid(path: &Path, reason: impl Into<String>) -> NpyError {
        NpyError::Invalid {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn unsupported(path: &Path, reason: impl Into<String>) -> NpyError {
        NpyError::Unsupported {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// A header problem, before it is given a file name.
enum HeaderError {
    Invalid(String),
    Unsupported(String),
}

impl HeaderError {
    fn at(self, path: &Path) -> NpyError {
        match self {
            HeaderError::Invalid(r) => NpyError::invalid(path, r),
            HeaderError::Unsupported(r) => NpyError::unsupported(path, r),
        }
    }
}

/// The parsed header dictionary.
struct Header {
    dtype: DType,
    shape: Vec<u64>,
}

/// Reads the `.npy` file at `path`.
///
/// The data is read straight into a 64-byte aligned buffer. Fails with an
/// error naming the file if it is not a valid `.npy` file, if its dtype,
/// byte order or memory order is not supported, or if the data is shorter or
/// longer than the header says.
///
/// # Examples
///
/// ```
/// use npy::read_npy;
/// use wire::DType;
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("logits.npy");
/// // What `numpy.save("logits.npy", np.arange(6, dtype=np.float32).reshape(2, 3))`
/// // writes:
/// let mut file = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
/// let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
/// file.extend_from_slice(format!("{dict:<117}\n").as_bytes());
/// for x in 0..6 {
///     file.extend_from_slice(&(x as f32).to_le_bytes());
/// }
/// std::fs::write(&path, &file)?;
///
/// let a = read_npy(&path)?;
/// assert_eq!((a.dtype, a.shape.as_slice()), (DType::F32, &[2, 3][..]));
/// assert_eq!(&a.data[20..24], 5f32.to_le_bytes());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn read_npy(path: &Path) -> Result<NpyArray, NpyError> {
    let mut file = File::open(path).map_err(|e| NpyError::io(path, e))?;
    // Only a regular file has a length worth checking up front; pipes and
    // character devices are read and checked as they come.
    let file_len = match file.metadata() {
        Ok(m) if m.is_file() => Some(m.len()),
        Ok(_) => None,
        Err(e) => return Err(NpyError::io(path, e)),
    };

    let mut prefix = [0u8; 8];
    read_exact_or(
        &mut file,
        &mut prefix,
        path,
        "file too short for the .npy magic",
    )?;
    if &prefix[..6] != MAGIC {
        return Err(NpyError::invalid(
            path,
            "missing the \\x93NUMPY magic: not a .npy file",
        ));
    }
    let (major, minor) = (prefix[6], prefix[7]);
    let len_field_size = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => {
            return Err(NpyError::unsupported(
                path,
                format!("format version {major}.{minor} (supported: 1.0, 2.0, 3.0)"),
            ))
        }
    };
    let mut len_bytes = [0u8; 4];
    read_exact_or(
        &mut file,
        &mut len_bytes[..len_field_size],
        path,
        "file too short for the header length",
    )?;
    let header_len = u32::from_le_bytes(len_bytes);
    let header_len = usize::try_from(header_len)
        .ok()
        .filter(|&n| n <= MAX_HEADER_LEN)
        .ok_or_else(|| {
            NpyError::invalid(
                path,
                format!("header length {header_len} exceeds the limit of {MAX_HEADER_LEN} bytes"),
            )
        })?;
    let mut header_text = vec![0u8; header_len];
    read_exact_or(
        &mut file,
        &mut header_text,
        path,
        "file ends inside the header",
    )?;
    let header = parse_header(&header_text).map_err(|e| e.at(path))?;

    let nbytes = data_len(header.dtype, &header.shape).map_err(|e| e.at(path))?;
    let data_offset = 8 + len_field_size + header_len;
    if let Some(file_len) = file_len {
        // Checked before allocating, so a tiny file claiming a huge shape
        // costs nothing.
        let have = file_len.saturating_sub(data_offset as u64);
        if have != nbytes as u64 {
            return Err(NpyError::invalid(
                path,
                length_mismatch(&header, nbytes as u64, have),
            ));
        }
    }
    let mut data = AlignedBuf::zeroed(nbytes).map_err(|e| NpyError::io(path, e))?;
    let got = read_up_to(&mut file, &mut data).map_err(|e| NpyError::io(path, e))?;
    if got < nbytes {
        return Err(NpyError::invalid(
            path,
            length_mismatch(&header, nbytes as u64, got as u64),
        ));
    }
    let mut extra = [0u8; 1];
    if read_up_to(&mut file, &mut extra).map_err(|e| NpyError::io(path, e))? != 0 {
        return Err(NpyError::invalid(
            path,
            format!(
                "trailing bytes after the {nbytes} data bytes that {} of shape {} take",
                header.dtype,
                shape_repr(&header.shape)
            ),
        ));
    }
    Ok(NpyArray {
        dtype: header.dtype,
        shape: header.shape,
        data,
    })
}

/// Writes `data` (little-endian elements in C order) as a `.npy` file at
/// `path`, creating or truncating it.
///
/// The header is the one NumPy itself would write (version 1.0, or 2.0 if the
/// header would not fit in 1.0's 16-bit length), and the data starts on a
/// 64-byte boundary. Fails if `data.len()` is not `product(shape) *
/// dtype.size()`, if the shape has more than [`MAX_NDIM`] dimensions, or for
/// [`DType::BF16`], which NumPy has no standard code for.
///
/// # Examples
///
/// ```
/// use npy::{read_npy, write_npy};
/// use wire::DType;
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("ids.npy");
/// let ids: Vec<u8> = [101i64, 2023, 102].iter().flat_map(|i| i.to_le_bytes()).collect();
/// write_npy(&path, DType::I64, &[1, 3], &ids)?;
/// // numpy.load reads it; so does read_npy.
/// let back = read_npy(&path)?;
/// assert_eq!((back.dtype, back.shape), (DType::I64, vec![1, 3]));
/// assert_eq!(&back.data[..], &ids[..]);
/// assert_eq!(std::fs::metadata(&path)?.len(), 128 + 24); // data on a 64-byte boundary
/// // The bytes must match dtype and shape.
/// assert!(write_npy(&path, DType::I64, &[1, 4], &ids).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_npy(path: &Path, dtype: DType, shape: &[u64], data: &[u8]) -> Result<(), NpyError> {
    let descr = descr_of(dtype).ok_or_else(|| {
        NpyError::unsupported(
            path,
            format!("{dtype} has no standard NumPy dtype; convert it to float32 first"),
        )
    })?;
    if shape.len() > MAX_NDIM {
        return Err(NpyError::unsupported(
            path,
            format!(
                "{} dimensions (at most {MAX_NDIM} are supported)",
                shape.len()
            ),
        ));
    }
    let nbytes = data_len(dtype, shape).map_err(|e| e.at(path))?;
    if data.len() != nbytes {
        return Err(NpyError::invalid(
            path,
            format!(
                "{} data bytes given, but {dtype} of shape {} takes {nbytes}",
                data.len(),
                shape_repr(shape)
            ),
        ));
    }
    let header = encode_header(descr, shape);
    let file = File::create(path).map_err(|e| NpyError::io(path, e))?;
    let mut out = BufWriter::new(file);
    out.write_all(&header)
        .and_then(|()| out.write_all(data))
        .and_then(|()| out.flush())
        .map_err(|e| NpyError::io(path, e))?;
    Ok(())
}

/// The NumPy `descr` string written for `dtype`, or `None` for bfloat16.
fn descr_of(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => return None,
        DType::F64 => "<f8",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
    })
}

/// The dtype a `descr` string denotes.
///
/// Accepted: the byte-order character `<` (little), `=` (native, on a
/// little-endian host), `|` (not applicable: one-byte types only) or `>` for
/// one-byte types (where order is meaningless), then a kind and size from
/// `f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1`.
fn parse_descr(descr: &str) -> Result<DType, HeaderError> {
    let unsupported = |why: &str| HeaderError::Unsupported(format!("dtype '{descr}': {why}"));
    let (order, code) = match descr.as_bytes().first() {
        Some(&c @ (b'<' | b'>' | b'=' | b'|')) => (c, &descr[1..]),
        _ => {
            return Err(unsupported(
                "expected a byte-order character ('<', '=', '|' or '>') first",
            ))
        }
    };
    let dtype = match code {
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        _ if code.starts_with('V') => {
            return Err(unsupported(
                "raw void/extension dtype (bfloat16 from ml_dtypes is stored this way) \
                 is not supported",
            ))
        }
        _ => {
            return Err(unsupported(
                "only f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1 are supported",
            ))
        }
    };
    let one_byte = dtype.size() == 1;
    match order {
        b'<' => Ok(dtype),
        b'=' if cfg!(target_endian = "little") => Ok(dtype),
        b'|' | b'>' if one_byte => Ok(dtype),
        b'>' => Err(unsupported("big-endian data is not supported")),
        b'=' => Err(unsupported("native byte order is big-endian here")),
        _ => Err(unsupported("'|' byte order on a multi-byte type")),
    }
}

/// Bytes taken by `dtype` elements of `shape`, checked for overflow.
fn data_len(dtype: DType, shape: &[u64]) -> Result<usize, HeaderError> {
    let overflow = || {
        HeaderError::Invalid(format!(
            "shape {} of {dtype} is too large to address",
            shape_repr(shape)
        ))
    };
    let mut n: u64 = dtype.size() as u64;
    for &d in shape {
        n = n.checked_mul(d).ok_or_else(overflow)?;
    }
    usize::try_from(n).map_err(|_| overflow())
}

fn length_mismatch(header: &Header, want: u64, have: u64) -> String {
    let what = if have < want {
        "data too short"
    } else {
        "trailing bytes after the data"
    };
    format!(
        "{what}: {} of shape {} takes {want} bytes, the file holds {have}",
        header.dtype,
        shape_repr(&header.shape)
    )
}

/// Python's `repr` of `shape` as a tuple: `()`, `(3,)`, `(2, 3)`.
fn shape_repr(shape: &[u64]) -> String {
    match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        _ => {
            let parts: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", parts.join(", "))
        }
    }
}

/// The full header (magic, version, length, dictionary, padding, newline),
/// byte-for-byte as NumPy 2's `_write_array_header` makes it.
fn encode_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let mut dict = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}",
        shape_repr(shape)
    );
    if let Some(first) = shape.first() {
        let digits = first.to_string().len();
        dict.push_str(&" ".repeat(GROWTH_AXIS_MAX_DIGITS.saturating_sub(digits)));
    }
    // Version 1.0 has a 16-bit length; 2.0 a 32-bit one. With at most
    // MAX_NDIM dimensions of at most 20 digits, 2.0 is never needed in
    // practice, but the choice is made the way NumPy makes it.
    let text_len = dict.len() + 1; // + the final newline
    let (version, len_size) = if padded(text_len, 2) <= usize::from(u16::MAX) {
        (1u8, 2usize)
    } else {
        (2u8, 4usize)
    };
    let total = padded(text_len, len_size);
    let pad = total - text_len;
    let mut out = Vec::with_capacity(8 + len_size + total);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    // `total` is bounded by MAX_NDIM * 22 + 100 bytes, far below u16::MAX.
    let total32 = u32::try_from(total).unwrap_or(u32::MAX);
    out.extend_from_slice(&total32.to_le_bytes()[..len_size]);
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + pad, b' ');
    out.push(b'\n');
    out
}

/// The header-text length, padding included, that puts the data of a file
/// whose header-length field is `len_size` bytes on an [`ARRAY_ALIGN`]
/// boundary. NumPy always adds 1 to 64 bytes of padding, never 0.
fn padded(text_len: usize, len_size: usize) -> usize {
    let prefix = MAGIC.len() + 2 + len_size;
    let pad = ARRAY_ALIGN - (prefix + text_len) % ARRAY_ALIGN;
    text_len + pad
}

/// Strict parser for the header dictionary NumPy writes, e.g.
/// `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }` followed by
/// spaces and a newline. Exactly the three keys, each once; string values
/// without escapes; `True`/`False`; a tuple of non-negative decimal integers.
fn parse_header(text: &[u8]) -> Result<Header, HeaderError> {
    let mut p = Parser { s: text, i: 0 };
    p.skip_ws();
    p.expect(b'{')?;
    let mut descr: Option<String> = None;
    let mut fortran: Option<bool> = None;
    let mut shape: Option<Vec<u64>> = None;
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string("a key")?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let duplicate = match key.as_str() {
            "descr" => {
                if p.peek() == Some(b'[') {
                    return Err(HeaderError::Unsupported(
                        "structured (record) dtypes are not supported".into(),
                    ));
                }
                descr.replace(p.string("the 'descr' value")?).is_some()
            }
            "fortran_order" => fortran.replace(p.boolean()?).is_some(),
            "shape" => shape.replace(p.tuple()?).is_some(),
            other => {
                return Err(HeaderError::Invalid(format!(
                    "unexpected key '{}' in the header",
                    other.escape_debug()
                )))
            }
        };
        if duplicate {
            return Err(HeaderError::Invalid(format!(
                "key '{key}' appears twice in the header"
            )));
        }
        p.skip_ws();
        if p.eat(b',') {
            continue;
        }
        p.skip_ws();
        p.expect(b'}')?;
        break;
    }
    p.skip_ws();
    if p.i != text.len() {
        return Err(HeaderError::Invalid(format!(
            "unexpected text after the header dictionary at byte {}",
            p.i
        )));
    }
    let missing = |k: &str| HeaderError::Invalid(format!("the header has no '{k}' key"));
    let descr = descr.ok_or_else(|| missing("descr"))?;
    let fortran = fortran.ok_or_else(|| missing("fortran_order"))?;
    let shape = shape.ok_or_else(|| missing("shape"))?;
    let dtype = parse_descr(&descr)?;
    if fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(HeaderError::Unsupported(
            "fortran_order is True: only C-ordered arrays are supported \
             (save numpy.ascontiguousarray(a) instead)"
                .into(),
        ));
    }
    // A Fortran-ordered array with at most one dimension longer than 1 has
    // the same bytes as the C-ordered one, so it is accepted as such.
    Ok(Header { dtype, shape })
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn error(&self, expected: &str) -> HeaderError {
        let found = match self.peek() {
            Some(c) if c.is_ascii_graphic() => format!("'{}'", c as char),
            Some(c) => format!("byte 0x{c:02x}"),
            None => "the end of the header".to_string(),
        };
        HeaderError::Invalid(format!(
            "malformed header: expected {expected} at byte {}, found {found}",
            self.i
        ))
    }

    fn expect(&mut self, c: u8) -> Result<(), HeaderError> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(self.error(&format!("'{}'", c as char)))
        }
    }

    /// A quoted string without escapes, ASCII printable only.
    fn string(&mut self, what: &str) -> Result<String, HeaderError> {
        let quote = match self.peek() {
            Some(q @ (b'\'' | b'"')) => q,
            _ => return Err(self.error(what)),
        };
        self.i += 1;
        let start = self.i;
        loop {
            match self.peek() {
                Some(c) if c == quote => break,
                Some(c) if (c.is_ascii_graphic() && c != b'\\') || c == b' ' => self.i += 1,
                _ => return Err(self.error("the end of a plain ASCII string")),
            }
        }
        let text = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
        self.i += 1;
        Ok(text)
    }

    fn boolean(&mut self) -> Result<bool, HeaderError> {
        let rest = &self.s[self.i..];
        if rest.starts_with(b"True") {
            self.i += 4;
            Ok(true)
        } else if rest.starts_with(b"False") {
            self.i += 5;
            Ok(false)
        } else {
            Err(self.error("True or False for 'fortran_order'"))
        }
    }

    /// A Python tuple of non-negative integers: `()`, `(3,)`, `(2, 3)`,
    /// `(2, 3,)`. `(3)` is an integer in Python, not a tuple, and is refused.
    fn tuple(&mut self) -> Result<Vec<u64>, HeaderError> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        let mut trailing_comma = false;
        loop {
            self.skip_ws();
            if self.eat(b')') {
                break;
            }
            if dims.len() == MAX_NDIM {
                return Err(HeaderError::Unsupported(format!(
                    "more than {MAX_NDIM} dimensions"
                )));
            }
            dims.push(self.integer()?);
            self.skip_ws();
            trailing_comma = self.eat(b',');
            if !trailing_comma {
                self.skip_ws();
                self.expect(b')')?;
                break;
            }
        }
        if dims.len() == 1 && !trailing_comma {
            return Err(HeaderError::Invalid(
                "malformed header: 'shape' is a parenthesised integer, not a tuple".into(),
            ));
        }
        Ok(dims)
    }

    /// A decimal integer without sign or leading zeros; Python 2's `L`
    /// suffix (old NumPy files) is accepted.
    fn integer(&mut self) -> Result<u64, HeaderError> {
        let start = self.i;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
        let digits = &self.s[start..self.i];
        if digits.is_empty() {
            return Err(self.error("a non-negative integer dimension"));
        }
        if digits.len() > 1 && digits[0] == b'0' {
            return Err(HeaderError::Invalid(
                "malformed header: dimension with a leading zero".into(),
            ));
        }
        let value = std::str::from_utf8(digits)
            .ok()
            .and_then(|d| d.parse::<u64>().ok())
            .ok_or_else(|| HeaderError::Invalid("a dimension does not fit in 64 bits".into()))?;
        self.eat(b'L');
        Ok(value)
    }
}

/// `read_exact`, with a clear "too short" error naming the file on EOF.
fn read_exact_or(file: &mut File, buf: &mut [u8], path: &Path, eof: &str) -> Result<(), NpyError> {
    let got = read_up_to(file, buf).map_err(|e| NpyError::io(path, e))?;
    if got < buf.len() {
        return Err(NpyError::invalid(path, eof));
    }
    Ok(())
}

/// Reads until `buf` is full or EOF; returns the number of bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Produced by NumPy 2.4.6 (`np.save`, or `numpy.lib.format.write_array`
    // with an explicit version), printed with `bytes.hex()`.

    /// `np.arange(6, dtype='<f4').reshape(2, 3) * 0.5`
    const F32_2X3: &str = "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028322c2033292c207d202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a000000000000003f0000803f0000c03f0000004000002040";
    /// `np.array([-1, 0, 2**40], dtype='<i8')`
    const I64_3: &str = "934e554d5059010076007b276465736372273a20273c6938272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028332c292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200affffffffffffffff00000000000000000000000000010000";
    /// `np.array([[True, False], [False, True]])`
    const BOOL_2X2: &str = "934e554d5059010076007b276465736372273a20277c6231272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028322c2032292c207d202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a01000001";
    /// `np.float64(1.5)` (a 0-d array)
    const F64_SCALAR: &str = "934e554d5059010076007b276465736372273a20273c6638272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a000000000000f83f";
    /// `np.zeros((0, 4), dtype='<f2')`
    const F16_EMPTY: &str = "934e554d5059010076007b276465736372273a20273c6632272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028302c2034292c207d202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a";
    /// `np.array([1, 2, 3, 255], dtype='u1')`, version 2.0
    const U8_V2: &str = "934e554d50590200740000007b276465736372273a20277c7531272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028342c292c207d202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a010203ff";
    /// `np.array([[-2, 7]], dtype='<i2')`, version 3.0
    const I16_V3: &str = "934e554d50590300740000007b276465736372273a20273c6932272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028312c2032292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200afeff0700";
    /// `np.asfortranarray(np.arange(6, dtype='<f4').reshape(2, 3))`
    const F32_FORTRAN: &str = "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a20547275652c20277368617065273a2028322c2033292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a00000000000040400000803f00008040000000400000a040";
    /// `np.array([1, 2], dtype='>i4')`
    const I32_BIG_ENDIAN: &str = "934e554d5059010076007b276465736372273a20273e6934272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028322c292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a0000000100000002";
    /// `np.array([4000000000], dtype='<u4')`
    const U32_1: &str = "934e554d5059010076007b276465736372273a20273c7534272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028312c292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a00286bee";

    fn unhex(s: &str) -> Vec<u8> {
        assert!(s.len().is_multiple_of(2));
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn write_bytes(dir: &tempfile::TempDir, name: &str, bytes: &[u8]) -> PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn read_bytes(bytes: &[u8]) -> Result<NpyArray, NpyError> {
        let dir = tempfile::tempdir().unwrap();
        read_npy(&write_bytes(&dir, "a.npy", bytes))
    }

    fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
        v.iter().flat_map(|&x| f(x)).collect()
    }

    /// Every file NumPy wrote reads back as what it holds, and writing the
    /// same array back gives NumPy's bytes exactly (for version 1.0 files).
    #[test]
    fn reads_numpy_files_and_writes_identical_bytes() {
        // (file as hex, dtype, shape, data, written as version 1.0)
        type Case = (&'static str, DType, Vec<u64>, Vec<u8>, bool);
        let cases: Vec<Case> = vec![
            (
                F32_2X3,
                DType::F32,
                vec![2, 3],
                le(&[0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], f32::to_le_bytes),
                true,
            ),
            (
                I64_3,
                DType::I64,
                vec![3],
                le(&[-1i64, 0, 1 << 40], i64::to_le_bytes),
                true,
            ),
            (BOOL_2X2, DType::Bool, vec![2, 2], vec![1, 0, 0, 1], true),
            (
                F64_SCALAR,
                DType::F64,
                vec![],
                1.5f64.to_le_bytes().to_vec(),
                true,
            ),
            (F16_EMPTY, DType::F16, vec![0, 4], vec![], true),
            (U8_V2, DType::U8, vec![4], vec![1, 2, 3, 255], false),
            (
                I16_V3,
                DType::I16,
                vec![1, 2],
                le(&[-2i16, 7], i16::to_le_bytes),
                false,
            ),
            (
                U32_1,
                DType::U32,
                vec![1],
                4_000_000_000u32.to_le_bytes().to_vec(),
                true,
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        for (hex, dtype, shape, data, v1) in cases {
            let bytes = unhex(hex);
            let a = read_bytes(&bytes).unwrap();
            assert_eq!(a.dtype, dtype);
            assert_eq!(a.shape, shape);
            assert_eq!(&*a.data, &data[..], "{dtype}");
            assert_eq!(a.data.as_ptr() as usize % 64, 0);
            if v1 {
                let p = dir.path().join("out.npy");
                write_npy(&p, dtype, &shape, &data).unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), bytes, "{dtype} {shape:?}");
            }
        }
    }

    #[test]
    fn round_trips_every_dtype() {
        let dir = tempfile::tempdir().unwrap();
        for dtype in DType::ALL {
            for shape in [vec![], vec![0], vec![5], vec![2, 3, 4], vec![1; 9]] {
                let n: u64 = shape.iter().product();
                let data: Vec<u8> = (0..n as usize * dtype.size())
                    .map(|i| (i * 37 % 251) as u8)
                    .map(|b| if dtype == DType::Bool { b & 1 } else { b })
                    .collect();
                let p = dir.path().join(format!("{dtype}.npy"));
                let res = write_npy(&p, dtype, &shape, &data);
                if dtype == DType::BF16 {
                    let e = res.unwrap_err();
                    assert!(matches!(e, NpyError::Unsupported { .. }), "{e}");
                    continue;
                }
                res.unwrap();
                let len = std::fs::metadata(&p).unwrap().len() as usize;
                assert_eq!((len - data.len()) % 64, 0, "data is 64-byte aligned");
                let a = read_npy(&p).unwrap();
                assert_eq!(a.dtype, dtype);
                assert_eq!(a.shape, shape);
                assert_eq!(&*a.data, &data[..]);
            }
        }
    }

    #[test]
    fn large_round_trip_uses_mapped_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big.npy");
        let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i % 253) as u8).collect();
        write_npy(&p, DType::F32, &[512, 512], &data).unwrap();
        let a = read_npy(&p).unwrap();
        assert_eq!(a.shape, vec![512, 512]);
        assert!(*a.data == data[..]);
    }

    fn err_text(bytes: &[u8]) -> String {
        let e = read_bytes(bytes).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("a.npy"), "error names the file: {s}");
        s
    }

    #[test]
    fn rejects_fortran_order_and_big_endian() {
        let s = err_text(&unhex(F32_FORTRAN));
        assert!(s.contains("fortran_order"), "{s}");
        let s = err_text(&unhex(I32_BIG_ENDIAN));
        assert!(s.contains("big-endian"), "{s}");
    }

    /// Builds a version 1.0 file around `dict` (padded like NumPy) and `data`.
    fn file_with(dict: &str, data: &[u8]) -> Vec<u8> {
        let text_len = dict.len() + 1;
        let total = padded(text_len, 2);
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(total as u16).to_le_bytes());
        out.extend_from_slice(dict.as_bytes());
        out.resize(out.len() + total - text_len, b' ');
        out.push(b'\n');
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn accepts_header_variants() {
        for dict in [
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }",
            "{\"shape\": (2,),\"descr\":\"=i4\",'fortran_order':False}",
            "{'descr': '<i4', 'fortran_order': False, 'shape': (2L,), }",
            "{'descr': '<i4', 'fortran_order': True, 'shape': (2,), }",
            "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, ), }",
            "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 2), }",
        ] {
            let a = read_bytes(&file_with(dict, &[1, 0, 0, 0, 2, 0, 0, 0])).unwrap();
            assert_eq!(a.dtype, DType::I32, "{dict}");
            assert_eq!(a.shape.iter().product::<u64>(), 2, "{dict}");
        }
        for descr in ["|u1", "<u1", "=u1", ">u1"] {
            let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (), }}");
            let a = read_bytes(&file_with(&dict, &[9])).unwrap();
            assert_eq!((a.dtype, &*a.data), (DType::U8, &[9u8][..]));
        }
    }

    #[test]
    fn rejects_malformed_headers() {
        let data = [0u8; 8];
        let cases = [
            ("{'descr': '<i4', 'fortran_order': False}", "no 'shape'"),
            ("{'descr': '<i4', 'shape': (2,)}", "no 'fortran_order'"),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}",
                "unexpected key",
            ),
            (
                "{'descr': '<i4', 'descr': '<i4', 'fortran_order': False, 'shape': (2,)}",
                "twice",
            ),
            (
                "{'descr': '<i4', 'fortran_order': 0, 'shape': (2,)}",
                "True or False",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2)}",
                "not a tuple",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (-2,)}",
                "non-negative",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (02,)}",
                "leading zero",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (,)}",
                "non-negative",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': [2]}",
                "'('",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)} x",
                "after the header",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)",
                "'}'",
            ),
            (
                "{'descr': '<i\\x34', 'fortran_order': False, 'shape': (2,)}",
                "plain ASCII",
            ),
            ("__import__('os')", "'{'"),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                "64 bits",
            ),
            (
                "{'descr': '<i4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
                "too large",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}",
                "supported",
            ),
            (
                "{'descr': '<V2', 'fortran_order': False, 'shape': (4,)}",
                "bfloat16",
            ),
            (
                "{'descr': 'f4', 'fortran_order': False, 'shape': (2,)}",
                "byte-order",
            ),
            (
                "{'descr': '|f4', 'fortran_order': False, 'shape': (2,)}",
                "multi-byte",
            ),
            (
                "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,)}",
                "structured",
            ),
            (
                "{'descr': '<O', 'fortran_order': False, 'shape': (2,)}",
                "supported",
            ),
        ];
        for (dict, needle) in cases {
            let s = err_text(&file_with(dict, &data));
            assert!(s.contains(needle), "{dict}: {s}");
        }
        let dims = vec!["1"; MAX_NDIM + 1].join(", ");
        let dict = format!("{{'descr': '<i4', 'fortran_order': False, 'shape': ({dims}), }}");
        assert!(err_text(&file_with(&dict, &[0; 4])).contains("dimensions"));
    }

    /// The header that makes `py_literal`-based readers backtrack for hours
    /// (see the crate doc) is refused here in one linear pass.
    #[test]
    fn nested_brackets_are_refused_at_once() {
        let deep = 20_000;
        let dict = format!(
            "{{'descr': {}'<i4'{}, 'fortran_order': False, 'shape': (2,), }}",
            "[".repeat(deep),
            "]".repeat(deep)
        );
        // An exponential parser would not return from this call.
        let s = err_text(&file_with(&dict, &[0; 8]));
        assert!(s.contains("structured"), "{s}");
    }

    #[test]
    fn rejects_bad_framing() {
        let good = unhex(F32_2X3);
        assert!(err_text(&[]).contains("magic"));
        assert!(err_text(&good[..4]).contains("magic"));
        assert!(err_text(b"PK\x03\x04 not npy").contains("magic"));
        assert!(err_text(&good[..9]).contains("header length"));
        assert!(err_text(&good[..50]).contains("inside the header"));

        let mut v = good.clone();
        v[6] = 4;
        assert!(err_text(&v).contains("version 4.0"));

        let mut v = good.clone();
        v[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(err_text(&v).contains("inside the header"));

        let mut v = b"\x93NUMPY\x02\x00".to_vec();
        v.extend_from_slice(&(MAX_HEADER_LEN as u32 + 1).to_le_bytes());
        assert!(err_text(&v).contains("exceeds the limit"));

        let s = err_text(&good[..good.len() - 1]);
        assert!(s.contains("too short") && s.contains("24 bytes"), "{s}");
        let mut v = good.clone();
        v.push(0);
        assert!(err_text(&v).contains("trailing bytes"));
    }

    /// A file whose length cannot be known up front (a pipe) is checked as it
    /// is read.
    #[test]
    fn checks_length_when_reading_a_pipe() {
        use std::process::Command;
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.npy");
        let ok = Command::new("mkfifo").arg(&fifo).status();
        if !matches!(ok, Ok(s) if s.success()) {
            return; // no mkfifo here; the regular-file tests cover the rest
        }
        for (extra, needle) in [(-1i32, Some("too short")), (0, None), (1, Some("trailing"))] {
            let mut bytes = unhex(U32_1);
            match extra {
                -1 => {
                    bytes.pop();
                }
                1 => bytes.push(7),
                _ => {}
            }
            let path = fifo.clone();
            // Opening a FIFO for writing blocks until the reader opens it.
            let feeder = std::thread::spawn(move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|mut f| f.write_all(&bytes))
            });
            let res = read_npy(&fifo);
            feeder.join().unwrap().unwrap();
            match needle {
                None => assert_eq!(&*res.unwrap().data, &4_000_000_000u32.to_le_bytes()),
                Some(n) => {
                    let s = res.unwrap_err().to_string();
                    assert!(s.contains(n) && s.contains("a.npy"), "{s}");
                }
            }
        }
    }

    #[test]
    fn write_checks_its_input() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.npy");
        let e = write_npy(&p, DType::F32, &[2, 2], &[0; 15]).unwrap_err();
        assert!(
            e.to_string().contains("w.npy") && e.to_string().contains("16"),
            "{e}"
        );
        let e = write_npy(&p, DType::F32, &[u64::MAX, 2], &[]).unwrap_err();
        assert!(e.to_string().contains("too large"), "{e}");
        let e = write_npy(&p, DType::U8, &[1; MAX_NDIM + 1], &[0]).unwrap_err();
        assert!(e.to_string().contains("dimensions"), "{e}");
        let e = write_npy(&dir.path().join("no/such/dir.npy"), DType::U8, &[], &[0]).unwrap_err();
        assert!(matches!(e, NpyError::Io { .. }) && e.to_string().contains("dir.npy"));
        let e = read_npy(&dir.path().join("missing.npy")).unwrap_err();
        assert!(matches!(e, NpyError::Io { .. }) && e.to_string().contains("missing.npy"));
    }
}
