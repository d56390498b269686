//! Tensor descriptors: the descriptor section of requests and responses.
//!
//! ```text
//! descriptor (24 + 8 × ndim bytes)
//!  0  1  dtype      DType code
//!  1  1  ndim       0..=8
//!  2  6  reserved   zero
//!  8  8  offset     byte offset of the tensor in the payload, multiple of 64
//! 16  8  length     byte length = product(dims) × dtype size
//! 24  8n dims       ndim × u64
//! ```
//!
//! A request or response's descriptor section is `tensor_count` descriptors,
//! followed by a 64-byte [`Timeline`] when the header has `HAS_TIMELINE`.
//! Tensors lie in the payload in order, 64-byte aligned, without overlap.

use crate::dtype::DType;
use crate::error::{need, WireError};
use crate::header::{flags, Header};
use crate::timeline::{Timeline, TIMELINE_LEN};

/// Alignment of every tensor's offset in the payload.
///
/// # Examples
///
/// ```
/// use wire::{layout_payload, PAYLOAD_ALIGN};
/// let (offsets, total) = layout_payload([10, 100, 1]).ok_or("fits")?;
/// assert!(offsets.iter().all(|o| o % PAYLOAD_ALIGN == 0));
/// assert_eq!((offsets, total), (vec![0, 64, 192], 193));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const PAYLOAD_ALIGN: u64 = 64;
/// Most dimensions a tensor may have.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section, encode_tensor_section, DType, Header, Kind, TensorDesc, MAX_DIMS};
/// let section = |dims: usize| {
///     let t = TensorDesc { dtype: DType::U8, shape: vec![1; dims], offset: 0, len: 1 };
///     let mut desc = Vec::new();
///     encode_tensor_section(&[t], None, &mut desc);
///     let mut h = Header::new(Kind::Request);
///     (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 1);
///     decode_tensor_section(&h, &desc).map(|s| s.tensors.len())
/// };
/// assert_eq!(section(MAX_DIMS)?, 1);
/// assert!(section(MAX_DIMS + 1).is_err());
/// # Ok::<(), wire::WireError>(())
/// ```
pub const MAX_DIMS: usize = 8;
/// Bytes of a descriptor before its dims.
///
/// # Examples
///
/// ```
/// use wire::{DType, TensorDesc, DESC_FIXED_LEN};
/// let t = TensorDesc { dtype: DType::F32, shape: vec![1, 3, 224, 224], offset: 0, len: 602_112 };
/// assert_eq!(t.encoded_len(), DESC_FIXED_LEN + 4 * 8); // then one u64 per dim
/// ```
pub const DESC_FIXED_LEN: usize = 24;

/// Rounds `n` up to a multiple of [`PAYLOAD_ALIGN`]; `None` on overflow.
///
/// # Examples
///
/// ```
/// use wire::align_up;
/// assert_eq!(align_up(0), Some(0));
/// assert_eq!(align_up(1), Some(64));
/// assert_eq!(align_up(128), Some(128));
/// assert_eq!(align_up(u64::MAX), None);
/// ```
pub fn align_up(n: u64) -> Option<u64> {
    n.checked_add(PAYLOAD_ALIGN - 1)
        .map(|v| v & !(PAYLOAD_ALIGN - 1))
}

/// Where one tensor lies in a payload, and what it is.
///
/// # Examples
///
/// ```
/// use wire::{DType, TensorDesc};
/// let t = TensorDesc { dtype: DType::F32, shape: vec![2, 3], offset: 0, len: 24 };
/// assert_eq!(TensorDesc::byte_len(t.dtype, &t.shape), Some(t.len));
/// assert_eq!(t.encoded_len(), 24 + 2 * 8);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDesc {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (at most [`MAX_DIMS`]; empty for a scalar).
    pub shape: Vec<u64>,
    /// Byte offset into the payload (multiple of 64).
    pub offset: u64,
    /// Byte length (product of dims × element size).
    pub len: u64,
}

impl TensorDesc {
    /// Bytes this descriptor takes on the wire.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{encode_tensor_section, DType, TensorDesc};
    /// let t = TensorDesc { dtype: DType::U8, shape: vec![4, 4, 4], offset: 0, len: 64 };
    /// let mut out = Vec::new();
    /// encode_tensor_section(std::slice::from_ref(&t), None, &mut out);
    /// assert_eq!(out.len(), t.encoded_len());
    /// ```
    pub fn encoded_len(&self) -> usize {
        DESC_FIXED_LEN + 8 * self.shape.len()
    }

    /// Number of elements, or `None` on overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::TensorDesc;
    /// assert_eq!(TensorDesc::numel(&[2, 3, 4]), Some(24));
    /// assert_eq!(TensorDesc::numel(&[]), Some(1)); // a scalar
    /// assert_eq!(TensorDesc::numel(&[u64::MAX, 2]), None);
    /// ```
    pub fn numel(shape: &[u64]) -> Option<u64> {
        shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Byte length of a tensor of `dtype` and `shape`, or `None` on overflow.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{DType, TensorDesc};
    /// assert_eq!(TensorDesc::byte_len(DType::F16, &[1, 3, 224, 224]), Some(301_056));
    /// assert_eq!(TensorDesc::byte_len(DType::F64, &[1 << 62]), None);
    /// ```
    pub fn byte_len(dtype: DType, shape: &[u64]) -> Option<u64> {
        TensorDesc::numel(shape)?.checked_mul(dtype.size() as u64)
    }
}

/// Lays tensors of the given byte lengths out in a payload: returns each
/// tensor's offset and the payload length. Offsets are 64-byte aligned and
/// tensors follow each other in order.
///
/// # Examples
///
/// ```
/// use wire::layout_payload;
/// // Three tensors of 10, 100 and 4 bytes, each starting on a 64-byte boundary.
/// let (offsets, total) = layout_payload([10, 100, 4]).ok_or("overflow")?;
/// assert_eq!(offsets, [0, 64, 192]);
/// assert_eq!(total, 196);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn layout_payload(lens: impl IntoIterator<Item = u64>) -> Option<(Vec<u64>, u64)> {
    let mut offsets = Vec::new();
    let mut end = 0u64;
    for len in lens {
        let off = align_up(end)?;
        offsets.push(off);
        end = off.checked_add(len)?;
    }
    Some((offsets, end))
}

/// The decoded descriptor section of a request or response.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section, encode_tensor_section, flags, DType, Header, Kind};
/// use wire::{TensorDesc, Timeline};
/// let tensors = vec![TensorDesc { dtype: DType::F32, shape: vec![10], offset: 0, len: 40 }];
/// let timeline = Timeline::from_stamps([1, 2, 3, 4, 5, 6]);
/// let mut desc = Vec::new();
/// encode_tensor_section(&tensors, Some(&timeline), &mut desc);
/// let mut h = Header::new(Kind::Response);
/// h.flags = flags::HAS_TIMELINE;
/// (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 40);
/// let section = decode_tensor_section(&h, &desc)?;
/// assert_eq!((section.tensors, section.timeline), (tensors, Some(timeline)));
/// # Ok::<(), wire::WireError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TensorSection {
    /// One descriptor per tensor, in order.
    pub tensors: Vec<TensorDesc>,
    /// The agent's timeline, when the header has `HAS_TIMELINE`.
    pub timeline: Option<Timeline>,
}

/// Appends the descriptor section for `tensors` (and `timeline`) to `out`.
/// The caller sets `tensor_count`, `desc_len` and the `HAS_TIMELINE` flag in
/// the header from what was written.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section, encode_tensor_section, layout_payload};
/// use wire::{DType, Header, Kind, TensorDesc};
/// // A request for two tensors: an int64[1, 8] and a float32[1, 8].
/// let shapes = [(DType::I64, vec![1, 8]), (DType::F32, vec![1, 8])];
/// let lens: Vec<u64> = shapes.iter().map(|(d, s)| TensorDesc::byte_len(*d, s).unwrap_or(0)).collect();
/// let (offsets, payload_len) = layout_payload(lens.iter().copied()).ok_or("overflow")?;
/// let tensors: Vec<TensorDesc> = shapes
///     .into_iter()
///     .zip(offsets.into_iter().zip(lens))
///     .map(|((dtype, shape), (offset, len))| TensorDesc { dtype, shape, offset, len })
///     .collect();
/// let mut desc = Vec::new();
/// encode_tensor_section(&tensors, None, &mut desc);
/// let mut h = Header::new(Kind::Request);
/// h.tensor_count = tensors.len() as u32;
/// h.desc_len = desc.len() as u32;
/// h.payload_len = payload_len;
/// assert_eq!(decode_tensor_section(&h, &desc)?.tensors, tensors);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn encode_tensor_section(
    tensors: &[TensorDesc],
    timeline: Option<&Timeline>,
    out: &mut Vec<u8>,
) {
    for t in tensors {
        out.push(t.dtype.code());
        out.push(t.shape.len() as u8);
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&t.offset.to_le_bytes());
        out.extend_from_slice(&t.len.to_le_bytes());
        for d in &t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
    }
    if let Some(tl) = timeline {
        out.extend_from_slice(&tl.encode());
    }
}

/// Where the tensors a descriptor section describes are.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section_in, encode_tensor_section, DType, Header, Kind, Placement};
/// use wire::TensorDesc;
/// // In a shared region tensors may come in any order.
/// let tensors = [
///     TensorDesc { dtype: DType::U8, shape: vec![64], offset: 128, len: 64 },
///     TensorDesc { dtype: DType::U8, shape: vec![64], offset: 0, len: 64 },
/// ];
/// let mut desc = Vec::new();
/// encode_tensor_section(&tensors, None, &mut desc);
/// let mut h = Header::new(Kind::Request);
/// (h.tensor_count, h.desc_len, h.payload_len) = (2, desc.len() as u32, 128);
/// assert!(decode_tensor_section_in(&h, &desc, Placement::Region { len: 4096 }).is_ok());
/// // In a stream payload they must come in order.
/// assert!(decode_tensor_section_in(&h, &desc, Placement::Payload).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// In the message's payload (stream transports): offsets increasing,
    /// inside `payload_len`.
    Payload,
    /// In a shared-memory region of `len` bytes (shm sessions): offsets
    /// relative to the region, in any order, inside it; `payload_len` is the
    /// sum of the tensors' lengths.
    Region {
        /// The region's length in bytes.
        len: u64,
    },
}

/// Decodes and validates a descriptor section against its header: exactly
/// `tensor_count` descriptors, consuming exactly `desc_len` bytes; known
/// dtypes; at most [`MAX_DIMS`] dims; length = dims × dtype size; offsets
/// aligned, increasing, non-overlapping and inside `payload_len`.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section, encode_tensor_section, DType, Header, Kind, TensorDesc};
/// let t = TensorDesc { dtype: DType::F32, shape: vec![4], offset: 0, len: 16 };
/// let mut desc = Vec::new();
/// encode_tensor_section(std::slice::from_ref(&t), None, &mut desc);
/// let mut h = Header::new(Kind::Request);
/// (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 16);
/// assert_eq!(decode_tensor_section(&h, &desc)?.tensors, [t]);
/// // A tensor reaching past the payload is refused before anything is read.
/// h.payload_len = 8;
/// assert!(decode_tensor_section(&h, &desc).is_err());
/// # Ok::<(), wire::WireError>(())
/// ```
pub fn decode_tensor_section(header: &Header, bytes: &[u8]) -> Result<TensorSection, WireError> {
    decode_tensor_section_in(header, bytes, Placement::Payload)
}

/// [`decode_tensor_section`] for tensors placed as `placement` says: in a
/// shared-memory region, tensors may come in any order but must lie inside
/// the region without overlapping, and `payload_len` must be their total
/// length.
///
/// # Examples
///
/// ```
/// use wire::{decode_tensor_section_in, encode_tensor_section, DType, Header, Kind, Placement};
/// use wire::TensorDesc;
/// let t = TensorDesc { dtype: DType::F32, shape: vec![256], offset: 4096, len: 1024 };
/// let mut desc = Vec::new();
/// encode_tensor_section(std::slice::from_ref(&t), None, &mut desc);
/// let mut h = Header::new(Kind::Request);
/// (h.tensor_count, h.desc_len, h.payload_len) = (1, desc.len() as u32, 1024);
/// assert!(decode_tensor_section_in(&h, &desc, Placement::Region { len: 8192 }).is_ok());
/// // Outside a region of 4 KiB.
/// assert!(decode_tensor_section_in(&h, &desc, Placement::Region { len: 4096 }).is_err());
/// ```
pub fn decode_tensor_section_in(
    header: &Header,
    bytes: &[u8],
    placement: Placement,
) -> Result<TensorSection, WireError> {
    if bytes.len() != header.desc_len as usize {
        return Err(section_len_mismatch(bytes.len(), header.desc_len));
    }
    let count = header.tensor_count as usize;
    // The descriptors, in their own function: every message decodes its
    // section, and the framing checks here stay a small function (no
    // message formatting in its frame) whatever the descriptors need.
    let (tensors, mut pos) = if count != 0 {
        decode_descriptors(header, bytes, placement)?
    } else if matches!(placement, Placement::Region { .. }) && header.payload_len != 0 {
        // In a region, `payload_len` is the tensors' total: here none (the
        // rule `decode_descriptors` checks for a non-empty set; kept here
        // rather than calling a shared check: this branch is every empty
        // request's, and the call cost 13 instructions a decode).
        return Err(payload_not_total(header.payload_len));
    } else {
        (Vec::new(), 0)
    };
    let timeline = if header.flags & flags::HAS_TIMELINE != 0 {
        let rest = &bytes[pos..];
        need("timeline", rest, TIMELINE_LEN)?;
        pos += TIMELINE_LEN;
        Some(Timeline::decode(&rest[..TIMELINE_LEN])?)
    } else {
        None
    };
    if pos != bytes.len() {
        return Err(trailing_bytes(bytes.len() - pos));
    }
    Ok(TensorSection { tensors, timeline })
}

#[cold]
fn section_len_mismatch(len: usize, desc_len: u32) -> WireError {
    WireError::malformed(format!(
        "descriptor section is {len} bytes, header says {desc_len}"
    ))
}

#[cold]
fn trailing_bytes(n: usize) -> WireError {
    WireError::malformed(format!("{n} trailing bytes after the descriptors"))
}

#[cold]
fn payload_not_total(payload_len: u64) -> WireError {
    WireError::malformed(format!(
        "payload_len {payload_len} is not the tensors' total length"
    ))
}

/// The `tensor_count` (≥ 1) descriptors at the start of `bytes`, checked
/// as [`decode_tensor_section_in`] says, and the bytes they took.
#[inline(never)]
fn decode_descriptors(
    header: &Header,
    bytes: &[u8],
    placement: Placement,
) -> Result<(Vec<TensorDesc>, usize), WireError> {
    let (bound, what, ordered) = match placement {
        Placement::Payload => (header.payload_len, "payload", true),
        Placement::Region { len } => (len, "region", false),
    };
    let count = header.tensor_count as usize;
    // Each descriptor needs at least DESC_FIXED_LEN bytes: a count the section
    // cannot hold is rejected before anything is allocated for it.
    if count.saturating_mul(DESC_FIXED_LEN) > bytes.len() {
        return Err(WireError::malformed(format!(
            "{count} tensors cannot fit in a {}-byte descriptor section",
            bytes.len()
        )));
    }
    let mut tensors = Vec::with_capacity(count);
    let mut pos = 0usize;
    let mut min_offset = 0u64;
    for i in 0..count {
        let rest = &bytes[pos..];
        need("tensor descriptor", rest, DESC_FIXED_LEN)?;
        let dtype = DType::from_code(rest[0])?;
        let ndim = rest[1] as usize;
        if ndim > MAX_DIMS {
            return Err(WireError::malformed(format!(
                "tensor {i} has {ndim} dims, at most {MAX_DIMS} allowed"
            )));
        }
        if rest[2..8].iter().any(|&b| b != 0) {
            return Err(WireError::malformed(format!(
                "tensor {i}: reserved bytes not zero"
            )));
        }
        need("tensor dims", rest, DESC_FIXED_LEN + 8 * ndim)?;
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&rest[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let offset = u64_at(8);
        let len = u64_at(16);
        let shape: Vec<u64> = (0..ndim).map(|d| u64_at(DESC_FIXED_LEN + 8 * d)).collect();
        let expect = TensorDesc::byte_len(dtype, &shape).ok_or_else(|| {
            WireError::malformed(format!("tensor {i}: shape {shape:?} overflows"))
        })?;
        if len != expect {
            return Err(WireError::malformed(format!(
                "tensor {i}: length {len} but {dtype}{shape:?} needs {expect} bytes"
            )));
        }
        if offset % PAYLOAD_ALIGN != 0 {
            return Err(WireError::malformed(format!(
                "tensor {i}: offset {offset} is not a multiple of {PAYLOAD_ALIGN}"
            )));
        }
        if ordered && offset < min_offset {
            return Err(WireError::malformed(format!(
                "tensor {i}: offset {offset} overlaps the previous tensor (ends at {min_offset})"
            )));
        }
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= bound)
            .ok_or_else(|| {
                WireError::malformed(format!(
                    "tensor {i}: bytes {offset}..+{len} fall outside the {bound}-byte {what}"
                ))
            })?;
        min_offset = end;
        pos += DESC_FIXED_LEN + 8 * ndim;
        tensors.push(TensorDesc {
            dtype,
            shape,
            offset,
            len,
        });
    }
    if !ordered {
        let total = tensors
            .iter()
            .try_fold(0u64, |acc, t| acc.checked_add(t.len));
        if total != Some(header.payload_len) {
            return Err(payload_not_total(header.payload_len));
        }
        // Overlap takes two tensors (and sorting a copy of their ranges).
        if tensors.len() > 1 {
            let mut ranges: Vec<(u64, u64)> = tensors
                .iter()
                .map(|t| (t.offset, t.offset + t.len))
                .collect();
            ranges.sort_unstable();
            if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
                return Err(WireError::malformed(format!(
                    "tensors at {} and {} overlap",
                    w[0].0, w[1].0
                )));
            }
        }
    }
    Ok((tensors, pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::Kind;

    fn section(tensors: &[TensorDesc], payload_len: u64) -> (Header, Vec<u8>) {
        let mut bytes = Vec::new();
        encode_tensor_section(tensors, None, &mut bytes);
        let mut h = Header::new(Kind::Request);
        h.tensor_count = tensors.len() as u32;
        h.desc_len = bytes.len() as u32;
        h.payload_len = payload_len;
        (h, bytes)
    }

    fn desc(dtype: DType, shape: &[u64], offset: u64) -> TensorDesc {
        TensorDesc {
            dtype,
            shape: shape.to_vec(),
            offset,
            len: TensorDesc::byte_len(dtype, shape).unwrap(),
        }
    }

    #[test]
    fn section_framing_errors_say_what_is_wrong() {
        let text = |h: &Header, bytes: &[u8], placement: Placement| match decode_tensor_section_in(
            h, bytes, placement,
        ) {
            Err(WireError::Malformed(m)) => m,
            other => panic!("expected Malformed, got {other:?}"),
        };
        let region = Placement::Region { len: 4096 };
        let mut h = Header::new(Kind::Request);
        h.desc_len = 8;
        assert_eq!(
            text(&h, &[0; 4], region),
            "descriptor section is 4 bytes, header says 8"
        );
        assert_eq!(
            text(&h, &[0; 8], region),
            "8 trailing bytes after the descriptors"
        );
        // No tensors in a region: payload_len must be their total, 0.
        let mut h = Header::new(Kind::Request);
        h.payload_len = 64;
        assert_eq!(
            text(&h, &[], region),
            "payload_len 64 is not the tensors' total length"
        );
        // In a payload, no tensors may come with any payload length.
        let s = decode_tensor_section_in(&h, &[], Placement::Payload).expect("empty section");
        assert!(s.tensors.is_empty() && s.timeline.is_none());
        // A tensor whose length is not the total, in a region.
        let (mut h, bytes) = section(&[desc(DType::U8, &[64], 0)], 64);
        h.payload_len = 65;
        assert_eq!(
            text(&h, &bytes, region),
            "payload_len 65 is not the tensors' total length"
        );
    }

    #[test]
    fn layout_aligns() {
        let (offs, len) = layout_payload([3, 64, 0, 1]).unwrap();
        assert_eq!(offs, vec![0, 64, 128, 128]);
        assert_eq!(len, 129);
        assert_eq!(layout_payload([]).unwrap(), (vec![], 0));
        assert!(layout_payload([u64::MAX, 1]).is_none());
    }

    #[test]
    fn round_trip_with_timeline() {
        let ts = vec![desc(DType::F32, &[2, 3], 0), desc(DType::Bool, &[], 64)];
        let tl = Timeline::from_stamps([1, 2, 3, 4, 5, 6]);
        let mut bytes = Vec::new();
        encode_tensor_section(&ts, Some(&tl), &mut bytes);
        let mut h = Header::new(Kind::Response);
        h.flags = flags::HAS_TIMELINE;
        h.tensor_count = 2;
        h.desc_len = bytes.len() as u32;
        h.payload_len = 65;
        let s = decode_tensor_section(&h, &bytes).unwrap();
        assert_eq!(s.tensors, ts);
        assert_eq!(s.timeline, Some(tl));
    }

    #[test]
    fn region_placement_allows_any_order_but_no_overlap() {
        let ts = vec![desc(DType::U8, &[10], 128), desc(DType::U8, &[10], 0)];
        let (mut h, b) = section(&ts, 20);
        let region = Placement::Region { len: 256 };
        assert_eq!(
            decode_tensor_section_in(&h, &b, region).unwrap().tensors,
            ts
        );
        assert!(decode_tensor_section(&h, &b).is_err(), "streams need order");
        assert!(decode_tensor_section_in(&h, &b, Placement::Region { len: 130 }).is_err());
        h.payload_len = 21;
        assert!(
            decode_tensor_section_in(&h, &b, region).is_err(),
            "payload_len = total"
        );
        let ts = vec![desc(DType::U8, &[100], 64), desc(DType::U8, &[10], 128)];
        let (h, b) = section(&ts, 110);
        assert!(decode_tensor_section_in(&h, &b, region).is_err(), "overlap");
    }

    #[test]
    fn rejects_bad_descriptors() {
        // Outside the payload.
        let (h, b) = section(&[desc(DType::U8, &[100], 0)], 99);
        assert!(decode_tensor_section(&h, &b).is_err());
        // Misaligned.
        let (h, b) = section(&[desc(DType::U8, &[1], 8)], 9);
        assert!(decode_tensor_section(&h, &b).is_err());
        // Overlapping.
        let (h, b) = section(
            &[desc(DType::U8, &[100], 0), desc(DType::U8, &[1], 64)],
            200,
        );
        assert!(decode_tensor_section(&h, &b).is_err());
        // Wrong length for the shape.
        let mut d = desc(DType::F32, &[4], 0);
        d.len = 15;
        let (h, b) = section(&[d], 16);
        assert!(decode_tensor_section(&h, &b).is_err());
        // Overflowing shape.
        let mut d = desc(DType::U8, &[1], 0);
        d.shape = vec![u64::MAX, 2];
        let (h, b) = section(&[d], 16);
        assert!(decode_tensor_section(&h, &b).is_err());
        // Count larger than the section can hold.
        let (mut h, b) = section(&[desc(DType::U8, &[1], 0)], 1);
        h.tensor_count = u32::MAX;
        assert!(decode_tensor_section(&h, &b).is_err());
        // Trailing bytes.
        let (mut h, mut b) = section(&[desc(DType::U8, &[1], 0)], 1);
        b.push(0);
        h.desc_len += 1;
        assert!(decode_tensor_section(&h, &b).is_err());
        // Too many dims.
        let (h, mut b) = section(&[desc(DType::U8, &[1], 0)], 1);
        b[1] = 9;
        assert!(decode_tensor_section(&h, &b).is_err());
    }
}
