//! The FFI boundary: C pointers checked and turned into Rust references,
//! strings and slices, each NULL or misuse reported as a [`Failure`]. Every
//! raw pointer the library dereferences goes through these functions, whose
//! contracts the `unsafe extern "C"` entry points pass on to their callers.

use crate::error::Failure;
use std::ffi::{c_char, CStr};

/// A pointer argument as a shared reference.
///
/// # Safety
/// `p` is NULL or points to a valid `T` that nothing writes to for `'a`.
pub unsafe fn arg_ref<'a, T>(p: *const T, name: &'static str) -> Result<&'a T, Failure> {
    check_aligned(p, name)?;
    // SAFETY: not NULL (`as_ref` checks) and aligned (checked above); valid
    // and unwritten for 'a by the caller's contract.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::null(name))
}

/// A pointer argument as an exclusive reference.
///
/// # Safety
/// `p` is NULL or points to a valid `T` that nothing else accesses for `'a`.
pub unsafe fn arg_mut<'a, T>(p: *mut T, name: &'static str) -> Result<&'a mut T, Failure> {
    check_aligned(p, name)?;
    // SAFETY: not NULL (`as_mut` checks) and aligned (checked above); valid
    // and not otherwise accessed for 'a by the caller's contract.
    unsafe { p.as_mut() }.ok_or_else(|| Failure::null(name))
}

/// An out-pointer: stores `init` in it (so that the caller sees a defined
/// value, e.g. NULL, whatever happens next) and returns it to be filled.
///
/// # Safety
/// `p` is NULL or valid for writes of a `T`, and nothing else accesses it
/// for `'a`. The old value is overwritten without being dropped (use only
/// for plain C values: pointers, numbers, `repr(C)` structs of them).
pub unsafe fn arg_out<'a, T: Copy>(
    p: *mut T,
    init: T,
    name: &'static str,
) -> Result<&'a mut T, Failure> {
    if p.is_null() {
        return Err(Failure::null(name));
    }
    check_aligned(p, name)?;
    // SAFETY: not NULL, aligned, and valid for writes by the caller's
    // contract; `write` reads nothing (the target may be uninitialized).
    unsafe { p.write(init) };
    // SAFETY: just initialized; exclusive for 'a by the caller's contract.
    Ok(unsafe { &mut *p })
}

/// A NUL-terminated string argument, which must be UTF-8.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that stays unchanged
/// for `'a`.
pub unsafe fn arg_str<'a>(p: *const c_char, name: &'static str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: not NULL; NUL-terminated and unchanged for 'a by the caller's
    // contract.
    let c = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|e| {
        Failure::InvalidArgument(format!(
            "`{name}` is not UTF-8 ({e}): {}",
            c.to_string_lossy()
        ))
    })
}

/// An array argument of `n` elements (`p` may be NULL when `n` is 0).
///
/// # Safety
/// Unless `n` is 0, `p` is NULL or points to `n` consecutive valid `T`s
/// that nothing writes to for `'a`.
pub unsafe fn arg_slice<'a, T>(
    p: *const T,
    n: usize,
    name: &'static str,
) -> Result<&'a [T], Failure> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Failure::null(name));
    }
    check_aligned(p, name)?;
    check_size::<T>(n, name)?;
    // SAFETY: not NULL, aligned, at most isize::MAX bytes (checked above);
    // `n` valid elements unwritten for 'a by the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// A writable array argument of `n` elements (`p` may be NULL when `n` is
/// 0).
///
/// # Safety
/// Unless `n` is 0, `p` is NULL or points to `n` consecutive valid `T`s
/// that nothing else accesses for `'a`.
pub unsafe fn arg_slice_mut<'a, T>(
    p: *mut T,
    n: usize,
    name: &'static str,
) -> Result<&'a mut [T], Failure> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Failure::null(name));
    }
    check_aligned(p, name)?;
    check_size::<T>(n, name)?;
    // SAFETY: not NULL, aligned, at most isize::MAX bytes (checked above);
    // `n` valid elements, exclusively the caller's for 'a by its contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

fn check_aligned<T>(p: *const T, name: &'static str) -> Result<(), Failure> {
    if p.is_aligned() {
        Ok(())
    } else {
        Err(Failure::InvalidArgument(format!(
            "`{name}` ({p:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )))
    }
}

fn check_size<T>(n: usize, name: &'static str) -> Result<(), Failure> {
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(b) if b <= isize::MAX as usize => Ok(()),
        _ => Err(Failure::InvalidArgument(format!(
            "`{name}`: {n} elements do not fit in memory"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::TwStatus;

    #[test]
    fn null_pointers_are_named() {
        // SAFETY: NULL is allowed by every helper's contract.
        unsafe {
            let e = arg_ref::<u32>(std::ptr::null(), "model").unwrap_err();
            assert_eq!(e.message(), "null argument: `model` is NULL");
            assert!(arg_mut::<u32>(std::ptr::null_mut(), "t").is_err());
            assert!(arg_out::<u32>(std::ptr::null_mut(), 0, "out").is_err());
            assert!(arg_str(std::ptr::null(), "uri").is_err());
            let e = arg_slice::<u8>(std::ptr::null(), 3, "inputs").unwrap_err();
            assert_eq!(e.status(), TwStatus::TW_ERR_NULL_ARGUMENT);
            assert!(arg_slice_mut::<u8>(std::ptr::null_mut(), 1, "outputs").is_err());
            assert!(arg_slice::<u8>(std::ptr::null(), 0, "inputs")
                .unwrap()
                .is_empty());
            assert!(arg_slice_mut::<u8>(std::ptr::null_mut(), 0, "outputs")
                .unwrap()
                .is_empty());
        }
    }

    #[test]
    fn strings_must_be_utf8() {
        let bad = b"caf\xe9\0";
        // SAFETY: a NUL-terminated byte string that outlives the call.
        let e = unsafe { arg_str(bad.as_ptr().cast(), "name") }.unwrap_err();
        assert_eq!(e.status(), TwStatus::TW_ERR_INVALID_ARGUMENT);
        assert!(
            e.message().contains("`name` is not UTF-8"),
            "{}",
            e.message()
        );
        // SAFETY: as above.
        let ok = unsafe { arg_str(c"digits".as_ptr(), "name") }.unwrap();
        assert_eq!(ok, "digits");
    }

    #[test]
    fn misaligned_and_oversized_arrays_are_refused() {
        let words = [0u64; 4];
        let odd = words.as_ptr().cast::<u8>().wrapping_add(1).cast::<u64>();
        // SAFETY: the helpers check alignment before reading anything.
        let e = unsafe { arg_slice(odd, 1, "dims") }.unwrap_err();
        assert!(e.message().contains("not aligned"), "{}", e.message());
        // SAFETY: the size check fails before anything is read.
        let e = unsafe { arg_slice(words.as_ptr(), usize::MAX / 4, "dims") }.unwrap_err();
        assert!(e.message().contains("do not fit"), "{}", e.message());
    }

    #[test]
    fn out_pointers_are_initialized_first() {
        let mut slot = 5u32;
        // SAFETY: a valid, exclusive u32.
        let r = unsafe { arg_out(&mut slot, 0, "out") }.unwrap();
        *r += 1;
        assert_eq!(slot, 1);
    }
}
