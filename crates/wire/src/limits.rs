//! Per-session limits, agreed in the hello exchange and checked on every message.

/// Bounds every length and count a peer may send on one session.
///
/// The agent's limits are the most it accepts; a client may ask for less in
/// its hello, and the acknowledged limits are the element-wise minimum.
///
/// # Examples
///
/// ```
/// use wire::Limits;
/// let agent = Limits::default();
/// assert_eq!(agent.max_payload, 256 << 20);
/// // A client that asks for less gets less; a 0 field asks for nothing.
/// let asked = Limits { max_tensors: 0, max_in_flight: 8, max_payload: 1 << 30, max_desc_len: 0 };
/// let agreed = agent.narrowed_by(&asked);
/// assert_eq!(agreed, Limits { max_in_flight: 8, ..agent });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most tensors in one request or response.
    pub max_tensors: u32,
    /// Most requests a client may have in flight on the session.
    pub max_in_flight: u32,
    /// Most payload bytes in one message.
    pub max_payload: u64,
    /// Most bytes in one descriptor section.
    pub max_desc_len: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tensors: 64,
            max_in_flight: 256,
            max_payload: 256 << 20,
            max_desc_len: 64 << 10,
        }
    }
}

impl Limits {
    /// The element-wise minimum; a zero in `asked` means "no preference".
    ///
    /// # Examples
    ///
    /// ```
    /// use wire::Limits;
    /// let agent = Limits { max_tensors: 4, ..Limits::default() };
    /// let asked = Limits { max_tensors: 16, max_in_flight: 2, max_payload: 0, max_desc_len: 0 };
    /// let l = agent.narrowed_by(&asked);
    /// assert_eq!((l.max_tensors, l.max_in_flight), (4, 2));
    /// assert_eq!(l.max_payload, agent.max_payload);
    /// ```
    pub fn narrowed_by(&self, asked: &Limits) -> Limits {
        fn pick<T: Ord + Copy + Default + PartialEq>(mine: T, theirs: T) -> T {
            if theirs == T::default() {
                mine
            } else {
                mine.min(theirs)
            }
        }
        Limits {
            max_tensors: pick(self.max_tensors, asked.max_tensors),
            max_in_flight: pick(self.max_in_flight, asked.max_in_flight),
            max_payload: pick(self.max_payload, asked.max_payload),
            max_desc_len: pick(self.max_desc_len, asked.max_desc_len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_takes_minimum_and_ignores_zero() {
        let agent = Limits::default();
        let asked = Limits {
            max_tensors: 8,
            max_in_flight: 0,
            max_payload: 1 << 40,
            max_desc_len: 1024,
        };
        let got = agent.narrowed_by(&asked);
        assert_eq!(got.max_tensors, 8);
        assert_eq!(got.max_in_flight, agent.max_in_flight);
        assert_eq!(got.max_payload, agent.max_payload);
        assert_eq!(got.max_desc_len, 1024);
    }
}
