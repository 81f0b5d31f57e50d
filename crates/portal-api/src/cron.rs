//! Cron schedules as CronJobs write them (the standard five fields that
//! Kubernetes parses with robfig/cron's `ParseStandard`): minute, hour, day
//! of month, month, day of week; `*`, `?`, ranges, steps, lists, month and
//! weekday names, and the `@yearly`, `@monthly`, `@weekly`, `@daily`,
//! `@hourly` shorthands. When both day fields are restricted a day
//! matching either runs, as cron does.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule: which minutes, hours, days, months and weekdays run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// Whether the day-of-month or day-of-week field was `*` (then a day
    /// must match both; otherwise either).
    any_day: bool,
    any_weekday: bool,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

impl Schedule {
    /// Parses a schedule, with the error upstream would report.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let text = text.trim();
        let expanded = match text {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => {
                return Err(format!("unrecognized descriptor: {other}"));
            }
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: {text}",
                fields.len()
            ));
        }
        Ok(Schedule {
            minutes: field(fields[0], 0, 59, &[])?,
            hours: field(fields[1], 0, 23, &[])?,
            days: field(fields[2], 1, 31, &[])?,
            months: field(fields[3], 1, 12, &MONTHS)?,
            // 7 is Sunday too.
            weekdays: {
                let bits = field(fields[4], 0, 7, &WEEKDAYS)?;
                (bits | (bits >> 7)) & 0x7f
            },
            any_day: matches!(fields[2], "*" | "?"),
            any_weekday: matches!(fields[4], "*" | "?"),
        })
    }

    fn day_matches(&self, date: Date) -> bool {
        let day = self.days & (1 << date.day()) != 0;
        let weekday = self.weekdays & (1 << date.weekday().to_sunday_zero_offset()) != 0;
        if self.any_day || self.any_weekday {
            day && weekday
        } else {
            day || weekday
        }
    }

    /// The first time strictly after `after` the schedule runs, in `zone`
    /// (`None` past five years: a schedule such as `0 0 30 2 *` never does).
    pub fn next_after(&self, after: Timestamp, zone: &TimeZone) -> Option<Timestamp> {
        let start = after.to_zoned(zone.clone()).datetime();
        // The next whole minute.
        let mut t = start
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = start.checked_add(5.years()).ok()?;
        while t <= limit {
            if self.months & (1 << t.month()) == 0 {
                t = DateTime::from(t.date().first_of_month().checked_add(1.month()).ok()?);
                continue;
            }
            if !self.day_matches(t.date()) {
                t = DateTime::from(t.date().checked_add(1.day()).ok()?);
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = zone.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

/// One field: `*`, `?`, `N`, `A-B`, either with `/STEP`, comma-separated;
/// names where the field has them.
fn field(text: &str, low: u32, high: u32, names: &[&str]) -> Result<u64, String> {
    let mut bits = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step
                    .parse()
                    .map_err(|_| format!("failed to parse int from {step}"))?;
                if step == 0 {
                    return Err(format!("step of range should be a positive number: {part}"));
                }
                (range, Some(step))
            }
            None => (part, None),
        };
        let value = |name: &str| -> Result<u32, String> {
            if let Some(at) = names.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                // Months count from 1, weekdays from 0.
                return u32::try_from(at)
                    .map(|at| at + low)
                    .map_err(|e| e.to_string());
            }
            name.parse()
                .map_err(|_| format!("failed to parse int from {name}"))
        };
        let (start, end) = match range {
            "*" | "?" => (low, high),
            _ => match range.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                None => {
                    let n = value(range)?;
                    (n, if step.is_some() { high } else { n })
                }
            },
        };
        if start < low || end > high || start > end {
            return Err(format!(
                "end of range ({end}) above maximum ({high}): {part}"
            ));
        }
        let step = step.unwrap_or(1);
        let mut n = start;
        while n <= end {
            bits |= 1 << n;
            n += step;
        }
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(schedule: &str, after: &str) -> String {
        let zone = TimeZone::UTC;
        Schedule::parse(schedule)
            .unwrap()
            .next_after(after.parse().unwrap(), &zone)
            .unwrap()
            .to_string()
    }

    #[test]
    fn schedules_run_when_cron_would() {
        assert_eq!(
            next("* * * * *", "2026-11-27T10:00:30Z"),
            "2026-11-27T10:01:00Z"
        );
        assert_eq!(
            next("*/15 * * * *", "2026-11-27T10:01:00Z"),
            "2026-11-27T10:15:00Z"
        );
        assert_eq!(
            next("0 9 * * mon-fri", "2026-11-27T10:00:00Z"),
            "2026-11-30T09:00:00Z"
        );
        assert_eq!(
            next("@monthly", "2026-11-27T10:00:00Z"),
            "2026-12-01T00:00:00Z"
        );
        assert_eq!(
            next("30 2 1 jan *", "2026-11-27T10:00:00Z"),
            "2027-01-01T02:30:00Z"
        );
        // Both day fields restricted: either matches (the 1st or a Sunday).
        assert_eq!(
            next("0 0 1 * 0", "2026-11-27T10:00:00Z"),
            "2026-11-29T00:00:00Z"
        );
        assert_eq!(
            next("0 0 * * 7", "2026-11-27T10:00:00Z"),
            "2026-11-29T00:00:00Z"
        );
        assert!(Schedule::parse("0 0 30 2 *")
            .unwrap()
            .next_after("2026-01-01T00:00:00Z".parse().unwrap(), &TimeZone::UTC)
            .is_none());
    }

    #[test]
    fn time_zones_shift_the_hours() {
        let zone = TimeZone::get("Europe/Berlin").unwrap();
        let at = Schedule::parse("0 9 * * *")
            .unwrap()
            .next_after("2026-11-27T10:00:00Z".parse().unwrap(), &zone)
            .unwrap();
        assert_eq!(at.to_string(), "2026-11-28T08:00:00Z");
    }

    #[test]
    fn bad_schedules_are_errors() {
        assert!(Schedule::parse("* * * *")
            .unwrap_err()
            .contains("expected exactly 5 fields"));
        assert!(Schedule::parse("61 * * * *").is_err());
        assert!(Schedule::parse("*/0 * * * *").is_err());
        assert!(Schedule::parse("@every 5m").is_err());
        assert!(Schedule::parse("0 0 * * funday").is_err());
    }
}
