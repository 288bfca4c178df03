//! Value parsers for options: every number and duration is range-checked where it is read, so
//! no option value can make a command panic.

use std::time::Duration;

/// The longest duration an option takes: ten years.
const MAX_DURATION: Duration = Duration::from_secs(3653 * 24 * 60 * 60);

/// A duration: `90s`, `5m`, `2h 30m`, `500ms` (humantime's format), or a bare number of seconds.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let parsed = match text.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => humantime::parse_duration(text).map_err(|e| {
            format!(
                "`{text}` is not a duration ({e}): write e.g. 30s, 5m, 2h or a number of seconds"
            )
        })?,
    };
    if parsed > MAX_DURATION {
        return Err(format!(
            "`{text}` is longer than the longest duration taken, 10 years"
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::duration;
    use std::time::Duration;

    #[test]
    fn durations_read_units_and_bare_seconds_and_refuse_the_rest() {
        assert_eq!(duration("0"), Ok(Duration::ZERO));
        assert_eq!(duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(duration("-5").unwrap_err().contains("not a duration"));
        assert!(duration("soon").unwrap_err().contains("not a duration"));
        assert!(duration("99999999999999").unwrap_err().contains("10 years"));
    }
}
