//! KServe v2 datatype names (`FP32`, `INT64`, `BOOL`, ...) and the
//! tensorwire [`DType`] each stands for.

use wire::DType;

/// The KServe v2 datatype string of a tensorwire dtype.
pub fn kserve_datatype(dtype: DType) -> &'static str {
    match dtype {
        DType::Bool => "BOOL",
        DType::U8 => "UINT8",
        DType::U16 => "UINT16",
        DType::U32 => "UINT32",
        DType::U64 => "UINT64",
        DType::I8 => "INT8",
        DType::I16 => "INT16",
        DType::I32 => "INT32",
        DType::I64 => "INT64",
        DType::F16 => "FP16",
        DType::F32 => "FP32",
        DType::F64 => "FP64",
        DType::BF16 => "BF16",
    }
}

/// The tensorwire dtype of a KServe v2 datatype string; `None` for one
/// tensorwire cannot carry (`BYTES`) or an unknown one (names are
/// case-sensitive, as in the protocol).
pub fn dtype_from_kserve(datatype: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|d| kserve_datatype(*d) == datatype)
}

/// Every datatype name tensorwire accepts, for error messages.
pub const SUPPORTED: &str = "BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, \
                             FP16, BF16, FP32, FP64";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatypes_round_trip() {
        for d in DType::ALL {
            assert_eq!(dtype_from_kserve(kserve_datatype(d)), Some(d));
            assert!(SUPPORTED.contains(kserve_datatype(d)));
        }
        assert_eq!(dtype_from_kserve("BYTES"), None);
        assert_eq!(dtype_from_kserve("fp32"), None);
    }
}
