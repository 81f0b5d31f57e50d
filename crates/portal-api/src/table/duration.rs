//! Ages as `kubectl` prints them (`apimachinery/pkg/util/duration`).

/// `5s`, `3m20s`, `45m`, `2h10m`, `10h`, `3d4h`, `20d`, `2y30d`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        let years = hours / 24 / 365;
        return if days == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{days}d")
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Seconds since the epoch of an RFC 3339 timestamp (`2026-01-02T03:04:05Z`).
pub(crate) fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let mut seconds = days * 86_400 + h * 3600 + mi * 60 + s;
    // An offset other than Z: `+01:00` is ahead of UTC.
    let rest = text
        .get(19..)?
        .trim_start_matches(|c: char| c == '.' || c.is_ascii_digit());
    if let Some(sign) = rest.chars().next().filter(|c| *c == '+' || *c == '-') {
        let oh = rest.get(1..3)?.parse::<i64>().ok()?;
        let om = rest.get(4..6)?.parse::<i64>().ok()?;
        let offset = oh * 3600 + om * 60;
        seconds -= if sign == '+' { offset } else { -offset };
    }
    Some(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_kubectl() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (180, "3m"),
            (45 * 60, "45m"),
            (2 * 3600 + 600, "130m"),
            (3 * 3600 + 600, "3h10m"),
            (10 * 3600, "10h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (20 * 86400, "20d"),
            (2 * 365 * 86400 + 30 * 86400, "2y30d"),
            (-5, "<invalid>"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2026-11-22T00:00:00Z"), Some(1_795_305_600));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("nonsense"), None);
    }
}
