//! Hostile bytes: the messages the attacks send. A [`valid_request`] is
//! the template; [`corruptions`] derives from it every single-field
//! corruption the issue lists (magic, version, kind, flags, ids, counts,
//! lengths at 0 / max / off by one, u64 overflow in shape products,
//! descriptors out of range and overlapping, payload lengths that lie) and
//! every byte of the descriptor section at 0x00, 0xFF and +1;
//! [`random_message`] is noise, sometimes with a valid header in front so
//! it gets past the first check. Everything is deterministic given the
//! seed, so a failure can be replayed.

use wire::{encode_tensor_section, layout_payload, DType, Header, Kind, TensorDesc, HEADER_LEN};

/// One hostile message: what it is (for reports) and its bytes.
#[derive(Clone, Debug)]
pub struct Attack {
    /// Which corruption (e.g. `header.payload_len=max`).
    pub name: String,
    /// The bytes sent after the Hello.
    pub bytes: Vec<u8>,
}

/// A valid request for model `model_id`: two tensors (u8 `[37]` and f32
/// `[2, 3]`), header, descriptor section and payload as one buffer, and
/// where the descriptor section starts and ends in it.
pub fn valid_request(request_id: u64, model_id: u32) -> (Vec<u8>, std::ops::Range<usize>) {
    let a: Vec<u8> = (0..37u8).collect();
    let b: Vec<u8> = (0..6)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect::<Vec<u8>>();
    let tensors = [
        (DType::U8, vec![37u64], &a),
        (DType::F32, vec![2u64, 3], &b),
    ];
    let (offsets, payload_len) =
        layout_payload(tensors.iter().map(|t| t.2.len() as u64)).unwrap_or((vec![0, 64], 128));
    let descs: Vec<TensorDesc> = tensors
        .iter()
        .zip(&offsets)
        .map(|((dtype, shape, data), &offset)| TensorDesc {
            dtype: *dtype,
            shape: shape.clone(),
            offset,
            len: data.len() as u64,
        })
        .collect();
    let mut desc = Vec::new();
    encode_tensor_section(&descs, None, &mut desc);
    let mut payload = vec![0u8; payload_len as usize];
    for ((_, _, data), &off) in tensors.iter().zip(&offsets) {
        payload[off as usize..off as usize + data.len()].copy_from_slice(data);
    }
    let mut h = Header::new(Kind::Request);
    h.request_id = request_id;
    h.model_id = model_id;
    h.tensor_count = descs.len() as u32;
    h.desc_len = desc.len() as u32;
    h.payload_len = payload_len;
    let mut out = h.encode().to_vec();
    let d0 = out.len();
    out.extend_from_slice(&desc);
    let d1 = out.len();
    out.extend_from_slice(&payload);
    (out, d0..d1)
}

/// A request to `model_id` carrying one `u8` tensor of `len` bytes at
/// offset 0: its header (payload length `len`) and descriptor section.
/// Over shm the tensor lies in the arena; `len` 0 gives the empty request.
pub fn u8_request(model_id: u32, request_id: u64, len: u64) -> (Header, Vec<u8>) {
    let mut desc = Vec::new();
    encode_tensor_section(
        &[TensorDesc {
            dtype: DType::U8,
            shape: vec![len],
            offset: 0,
            len,
        }],
        None,
        &mut desc,
    );
    let mut h = Header::new(Kind::Request);
    h.model_id = model_id;
    h.request_id = request_id;
    h.tensor_count = 1;
    h.desc_len = desc.len() as u32;
    h.payload_len = len;
    (h, desc)
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// Every single-field corruption of [`valid_request`]`(request_id,
/// model_id)`, named.
pub fn corruptions(request_id: u64, model_id: u32) -> Vec<Attack> {
    let (valid, desc) = valid_request(request_id, model_id);
    let mut out = Vec::new();
    let mut with = |name: String, f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = valid.clone();
        f(&mut b);
        // (0x00 on a byte that is already 0 changes nothing: not an attack.)
        if b != valid {
            out.push(Attack { name, bytes: b });
        }
    };
    // Header fields (offsets: wire::Header::encode).
    for i in 0..4 {
        with(format!("header.magic[{i}]^0xff"), &|b| b[i] ^= 0xff);
    }
    for v in [0u16, 2, 0xffff] {
        with(format!("header.version={v}"), &|b| {
            put(b, 4, &v.to_le_bytes())
        });
    }
    for k in [0u8, 9, 0x7f, 0xff] {
        with(format!("header.kind={k}"), &|b| b[6] = k);
    }
    for bit in 0..8 {
        with(format!("header.flags|=1<<{bit}"), &|b| b[7] |= 1 << bit);
    }
    with("header.request_id=0".into(), &|b| {
        put(b, 8, &0u64.to_le_bytes())
    });
    for m in [0u32, model_id + 1000, u32::MAX] {
        with(format!("header.model_id={m}"), &|b| {
            put(b, 16, &m.to_le_bytes())
        });
    }
    let count = u32::from_le_bytes([valid[20], valid[21], valid[22], valid[23]]);
    for c in [0, 1, count + 1, 4096, u32::MAX] {
        with(format!("header.tensor_count={c}"), &|b| {
            put(b, 20, &c.to_le_bytes())
        });
    }
    let dlen = (desc.end - desc.start) as u32;
    for d in [0, 1, dlen - 1, dlen + 1, dlen + 8, 1 << 20, u32::MAX] {
        with(format!("header.desc_len={d}"), &|b| {
            put(b, 24, &d.to_le_bytes())
        });
    }
    for s in [1u32, 7, 0xffff, u32::MAX] {
        with(format!("header.status={s}"), &|b| {
            put(b, 28, &s.to_le_bytes())
        });
    }
    let plen = u64::from_le_bytes(valid[32..40].try_into().unwrap_or([0; 8]));
    for p in [
        0,
        1,
        plen - 1,
        plen + 1,
        plen + 64,
        1 << 40,
        u64::MAX - 63,
        u64::MAX,
    ] {
        with(format!("header.payload_len={p}"), &|b| {
            put(b, 32, &p.to_le_bytes())
        });
    }
    for t in [1u32, u32::MAX] {
        with(format!("header.timeout_us={t}"), &|b| {
            put(b, 40, &t.to_le_bytes())
        });
    }
    for p in [1u8, 2, 255] {
        with(format!("header.priority={p}"), &|b| b[44] = p);
    }
    for i in 45..HEADER_LEN {
        with(format!("header.reserved[{i}]=1"), &|b| b[i] = 1);
    }
    // Every descriptor byte at 0x00, 0xFF and +1.
    for i in desc.clone() {
        with(format!("desc[{}]=0", i - desc.start), &|b| b[i] = 0);
        with(format!("desc[{}]=0xff", i - desc.start), &|b| b[i] = 0xff);
        with(format!("desc[{}]+=1", i - desc.start), &|b| {
            b[i] = b[i].wrapping_add(1)
        });
    }
    // Whole-descriptor lies: shape products that overflow u64, tensors out
    // of range or overlapping, lengths that disagree with shapes.
    let lies: [(&str, Vec<TensorDesc>, u64); 5] = [
        (
            "desc.shape_product_overflows",
            vec![TensorDesc {
                dtype: DType::F32,
                shape: vec![1 << 32, 1 << 32, 16],
                offset: 0,
                len: 64,
            }],
            64,
        ),
        (
            "desc.offset_past_payload",
            vec![TensorDesc {
                dtype: DType::U8,
                shape: vec![64],
                offset: 1 << 20,
                len: 64,
            }],
            64,
        ),
        (
            "desc.overlapping",
            vec![
                TensorDesc {
                    dtype: DType::U8,
                    shape: vec![128],
                    offset: 0,
                    len: 128,
                },
                TensorDesc {
                    dtype: DType::U8,
                    shape: vec![64],
                    offset: 64,
                    len: 64,
                },
            ],
            192,
        ),
        (
            "desc.len_disagrees_with_shape",
            vec![TensorDesc {
                dtype: DType::F32,
                shape: vec![4],
                offset: 0,
                len: 15,
            }],
            64,
        ),
        (
            "desc.offset_plus_len_overflows",
            vec![TensorDesc {
                dtype: DType::U8,
                shape: vec![64],
                offset: u64::MAX - 10,
                len: 64,
            }],
            64,
        ),
    ];
    for (name, descs, payload_len) in lies {
        let mut d = Vec::new();
        encode_tensor_section(&descs, None, &mut d);
        let mut h = Header::new(Kind::Request);
        h.request_id = request_id;
        h.model_id = model_id;
        h.tensor_count = descs.len() as u32;
        h.desc_len = d.len() as u32;
        h.payload_len = payload_len;
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&d);
        b.resize(b.len() + payload_len as usize, 0xa5);
        out.push(Attack {
            name: name.into(),
            bytes: b,
        });
    }
    out
}

/// Every truncation of [`valid_request`]: its first `k` bytes for each
/// `k` from 1 to its length − 1.
pub fn truncations(request_id: u64, model_id: u32) -> Vec<Attack> {
    let (valid, _) = valid_request(request_id, model_id);
    (1..valid.len())
        .map(|k| Attack {
            name: format!("truncated at byte {k}"),
            bytes: valid[..k].to_vec(),
        })
        .collect()
}

/// Noise: 1 to 512 random bytes, half the time behind a valid request
/// header whose lengths announce them (so the noise reaches the
/// descriptor decoder).
pub fn random_message(rng: &mut fastrand::Rng, model_id: u32) -> Attack {
    let n = rng.usize(1..=512);
    let noise: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
    if rng.bool() {
        let mut h = Header::new(Kind::Request);
        h.request_id = rng.u64(1..);
        h.model_id = model_id;
        h.tensor_count = rng.u32(1..=4);
        let d = rng.usize(0..=n);
        h.desc_len = d as u32;
        h.payload_len = (n - d) as u64;
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&noise);
        Attack {
            name: "random behind a header".into(),
            bytes: b,
        }
    } else {
        Attack {
            name: "random".into(),
            bytes: noise,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_decodes_and_every_corruption_differs_from_it() {
        let (valid, desc) = valid_request(5, 1);
        let h = Header::decode(&valid[..HEADER_LEN]).expect("a valid header");
        let section = wire::decode_tensor_section(&h, &valid[desc.clone()]).expect("descriptors");
        assert_eq!(section.tensors.len(), 2);
        let all = corruptions(5, 1);
        // Each descriptor byte gives two or three (0x00 on a 0 is none).
        assert!(all.len() > 2 * (desc.end - desc.start), "{}", all.len());
        for a in &all {
            assert_ne!(a.bytes, valid, "{} is not a corruption", a.name);
        }
        assert_eq!(truncations(5, 1).len(), valid.len() - 1);
    }

    #[test]
    fn noise_is_deterministic_per_seed() {
        let a = random_message(&mut fastrand::Rng::with_seed(3), 1);
        let b = random_message(&mut fastrand::Rng::with_seed(3), 1);
        assert_eq!(a.bytes, b.bytes);
    }
}
