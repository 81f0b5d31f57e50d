//! Kubernetes resource quantities as numbers: memory in bytes (`64Mi`,
//! `1G`, `128974848`, `129e6`), CPU in millicores (`500m`, `1`, `0.25`,
//! `250000000n` as the metrics API writes it).

/// The value of a quantity in units of 1/`scale` (scale 1 for bytes,
/// 1000 for millicores), rounded up; `None` when malformed or too big.
fn parse(text: &str, scale: f64) -> Option<i64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let multiplier = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => 10f64.powi(exponent[1..].parse().ok()?),
        _ => return None,
    };
    let value = (number * multiplier * scale).ceil();
    (value.is_finite() && value >= 0.0 && value < i64::MAX as f64).then_some(value as i64)
}

/// Bytes of a memory quantity.
pub fn bytes(text: &str) -> Option<i64> {
    parse(text, 1.0)
}

/// Millicores of a CPU quantity.
pub fn millicores(text: &str) -> Option<i64> {
    parse(text, 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_and_cpu() {
        assert_eq!(bytes("64Mi"), Some(64 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("128974848"), Some(128_974_848));
        assert_eq!(bytes("129e6"), Some(129_000_000));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(millicores("500m"), Some(500));
        assert_eq!(millicores("2"), Some(2000));
        assert_eq!(millicores("0.25"), Some(250));
        // The metrics API writes nanocores; a part of a millicore rounds up.
        assert_eq!(millicores("1001442537n"), Some(1002));
        assert_eq!(millicores("250u"), Some(1));
        assert_eq!(bytes("12 parsecs"), None);
        assert_eq!(bytes("-1"), None);
    }
}
