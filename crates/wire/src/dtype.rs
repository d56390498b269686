//! Element types a tensor may have, their wire codes and sizes.

use crate::error::WireError;

/// The element type of a tensor. The discriminant is the wire code.
///
/// # Examples
///
/// ```
/// use wire::DType;
/// // A tensor's bytes are its element count times its dtype's size.
/// assert_eq!(DType::F16.size() * 3 * 224 * 224, 301_056);
/// assert_eq!(DType::F32.to_string(), "float32");
/// assert_eq!(DType::from_name("int64"), Some(DType::I64));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 1,
    /// IEEE 754 binary16.
    F16 = 2,
    /// bfloat16 (the upper half of a binary32).
    BF16 = 3,
    /// IEEE 754 binary64.
    F64 = 4,
    /// Signed 8-bit integer.
    I8 = 5,
    /// Signed 16-bit integer.
    I16 = 6,
    /// Signed 32-bit integer.
    I32 = 7,
    /// Signed 64-bit integer.
    I64 = 8,
    /// Unsigned 8-bit integer.
    U8 = 9,
    /// Unsigned 16-bit integer.
    U16 = 10,
    /// Unsigned 32-bit integer.
    U32 = 11,
    /// Unsigned 64-bit integer.
    U64 = 12,
    /// Boolean, one byte per element (0 = false, 1 = true).
    Bool = 13,
}

impl DType {
    /// Every dtype, in wire-code order.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::DType;
    /// assert_eq!(DType::ALL.len(), 13);
    /// assert!(DType::ALL.iter().all(|d| d.size() >= 1));
    /// ```
    pub const ALL: [DType; 13] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
    ];

    /// Size of one element in bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::DType;
    /// assert_eq!(DType::BF16.size(), 2);
    /// assert_eq!(DType::Bool.size(), 1);
    /// assert_eq!(DType::U64.size(), 8);
    /// ```
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The wire code of this dtype.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::DType;
    /// assert_eq!(DType::F32.code(), 1);
    /// assert_eq!(DType::from_code(DType::I8.code())?, DType::I8);
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The dtype with wire code `code`.
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::{DType, WireError};
    /// assert_eq!(DType::from_code(9)?, DType::U8);
    /// assert!(matches!(DType::from_code(0), Err(WireError::UnknownDType(0))));
    /// # Ok::<(), wire::WireError>(())
    /// ```
    pub fn from_code(code: u8) -> Result<DType, WireError> {
        DType::ALL
            .get(usize::from(code).wrapping_sub(1))
            .copied()
            .ok_or(WireError::UnknownDType(code))
    }

    /// Short lower-case name, as used by numpy (`float32`, `int64`, `bool`, ...).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::DType;
    /// assert_eq!(DType::BF16.name(), "bfloat16");
    /// assert_eq!(DType::Bool.name(), "bool");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::Bool => "bool",
        }
    }

    /// Parses a name produced by [`DType::name`] (also accepts `f32`, `i64`, ... forms).
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::DType;
    /// assert_eq!(DType::from_name("float16"), Some(DType::F16));
    /// assert_eq!(DType::from_name("F16"), Some(DType::F16)); // short names, any case
    /// assert_eq!(DType::from_name("complex64"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<DType> {
        let n = name.to_ascii_lowercase();
        DType::ALL.into_iter().find(|d| {
            d.name() == n || {
                let short = match d {
                    DType::F32 => "f32",
                    DType::F16 => "f16",
                    DType::BF16 => "bf16",
                    DType::F64 => "f64",
                    DType::I8 => "i8",
                    DType::I16 => "i16",
                    DType::I32 => "i32",
                    DType::I64 => "i64",
                    DType::U8 => "u8",
                    DType::U16 => "u16",
                    DType::U32 => "u32",
                    DType::U64 => "u64",
                    DType::Bool => "b8",
                };
                short == n
            }
        })
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()).unwrap(), d);
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert!(DType::from_code(0).is_err());
        assert!(DType::from_code(14).is_err());
        assert!(DType::from_code(255).is_err());
    }
}
