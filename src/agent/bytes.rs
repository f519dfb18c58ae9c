//! Byte sizes as people write them in the simulated-GPU file and in `/check`
//! queries: a plain integer (bytes) or a number with a unit (`80GiB`,
//! `512 MiB`, `1.5GiB`, `40GB`). Binary units are powers of 1024, decimal
//! units powers of 1000, as in `nvidia-smi` (MiB) and vendor sheets (GB).

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("ki", 1 << 10),
    ("mi", 1 << 20),
    ("gi", 1 << 30),
    ("ti", 1 << 40),
];

/// Parse `"80GiB"`, `"512 MiB"`, `"1.5GiB"`, `"40GB"` or `"1234"` into bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number = number.replace('_', "");
    let unit = unit.trim().to_ascii_lowercase();
    let scale = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                format!(
                    "{text:?}: unknown unit {unit:?}; use bytes or one of B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
                )
            })?
    };
    if number.is_empty() {
        return Err(format!("{text:?}: expected a number of bytes, e.g. 80GiB"));
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(scale)
            .ok_or_else(|| format!("{text:?}: too large for 64 bits"));
    }
    let f: f64 = number
        .parse()
        .map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
    let bytes = (f * scale as f64).round();
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("{text:?}: too large for 64 bits"));
    }
    Ok(bytes as u64)
}

/// Format bytes for people: `80.00 GiB`, `512.0 MiB`, `12 B`.
pub fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.1} MiB", b / MIB)
    } else {
        format!("{bytes} B")
    }
}

/// A byte count that deserializes from an integer or a string with a unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count: an integer, or a string such as \"80GiB\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{v} is negative; a byte count is ≥ 0")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64 {
                    Ok(ByteSize(v as u64))
                } else {
                    Err(E::custom(format!(
                        "{v} is not a whole, non-negative byte count"
                    )))
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_bytes(v).map(ByteSize).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_bytes("1234"), Ok(1234));
        assert_eq!(parse_bytes("80GiB"), Ok(80 << 30));
        assert_eq!(parse_bytes("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_bytes("40GB"), Ok(40_000_000_000));
        assert_eq!(parse_bytes("2mi"), Ok(2 << 20));
        assert_eq!(parse_bytes("1_000"), Ok(1000));
    }

    #[test]
    fn errors_say_what_is_valid() {
        let e = parse_bytes("3 parsecs").unwrap_err();
        assert!(e.contains("unknown unit") && e.contains("GiB"), "{e}");
        assert!(
            parse_bytes("GiB")
                .unwrap_err()
                .contains("expected a number")
        );
        assert!(
            parse_bytes("99999999999TiB")
                .unwrap_err()
                .contains("64 bits")
        );
    }

    #[test]
    fn deserializes_from_numbers_and_strings() {
        let v: Vec<ByteSize> = serde_json::from_str(r#"[1, "1KiB", 2.0]"#).unwrap();
        assert_eq!(v, vec![ByteSize(1), ByteSize(1024), ByteSize(2)]);
        assert!(serde_json::from_str::<ByteSize>("-1").is_err());
        assert!(serde_json::from_str::<ByteSize>("1.5").is_err());
    }
}
