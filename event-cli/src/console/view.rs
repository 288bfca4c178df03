//! What templates show: times in UTC and relative, statuses as words, the per-minute chart as
//! SVG shapes, links with their query strings.

use chrono::{DateTime, TimeDelta, Utc};
use event_sqlx::{EventStatus, MinuteCount, OutboxRecord};

/// A time, in UTC and relative to now.
#[derive(Debug, Clone)]
pub(crate) struct When {
    /// `2026-11-30 13:45:02 UTC`.
    pub(crate) utc: String,
    /// RFC 3339, for `<time datetime>`.
    pub(crate) iso: String,
    /// `3 min ago`, `in 20 s`.
    pub(crate) rel: String,
}

impl When {
    pub(crate) fn new(at: DateTime<Utc>, now: DateTime<Utc>) -> When {
        When {
            utc: at.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
            iso: at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            rel: relative(at, now),
        }
    }

    pub(crate) fn opt(at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<When> {
        at.map(|at| When::new(at, now))
    }
}

/// `3 min ago` or `in 3 min`.
pub(crate) fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let delta = now - at;
    let (future, delta) = if delta < TimeDelta::zero() {
        (true, -delta)
    } else {
        (false, delta)
    };
    let seconds = delta.num_seconds();
    let amount = if seconds < 60 {
        format!("{seconds} s")
    } else if seconds < 3600 {
        format!("{} min", seconds / 60)
    } else if seconds < 48 * 3600 {
        format!("{} h", seconds / 3600)
    } else {
        format!("{} d", seconds / 86_400)
    };
    if future {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

/// A status as a word, and the CSS class that colours it.
pub(crate) fn status(status: EventStatus) -> (&'static str, &'static str) {
    match status {
        EventStatus::Pending => ("pending", "s-pending"),
        EventStatus::InProgress => ("in progress", "s-progress"),
        EventStatus::Succeeded => ("published", "s-ok"),
        EventStatus::Failed => ("failed", "s-failed"),
        EventStatus::Cancelled => ("cancelled", "s-cancelled"),
    }
}

/// The status a search form names.
pub(crate) fn parse_status(name: &str) -> Option<EventStatus> {
    Some(match name {
        "pending" => EventStatus::Pending,
        "in_progress" => EventStatus::InProgress,
        "published" => EventStatus::Succeeded,
        "failed" => EventStatus::Failed,
        "cancelled" => EventStatus::Cancelled,
        _ => return None,
    })
}

/// The form value of a status.
pub(crate) fn status_value(status: EventStatus) -> &'static str {
    match status {
        EventStatus::Pending => "pending",
        EventStatus::InProgress => "in_progress",
        EventStatus::Succeeded => "published",
        EventStatus::Failed => "failed",
        EventStatus::Cancelled => "cancelled",
    }
}

/// One outbox row in a list.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) event_no: String,
    pub(crate) event_link: String,
    pub(crate) event_type: String,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_link: String,
    pub(crate) sequence: i64,
    pub(crate) topic: String,
    pub(crate) status: &'static str,
    pub(crate) status_class: &'static str,
    pub(crate) retries: String,
    pub(crate) created: When,
    pub(crate) published: Option<When>,
    pub(crate) next_retry: Option<When>,
    pub(crate) fail_reason: String,
    pub(crate) blocking: bool,
    pub(crate) unpublished: bool,
    pub(crate) failed: bool,
}

impl Row {
    pub(crate) fn new(r: &OutboxRecord, now: DateTime<Utc>) -> Row {
        let (status, status_class) = status(r.publish_status);
        Row {
            event_no: r.event_no.clone(),
            event_link: link("/event", &[("no", &r.event_no)]),
            event_type: r.event_type.clone(),
            aggregate_type: r.aggregate_type.clone(),
            aggregate_id: r.aggregate_id.clone(),
            aggregate_link: link(
                "/aggregate",
                &[("type", &r.aggregate_type), ("id", &r.aggregate_id)],
            ),
            sequence: r.aggregate_sequence,
            topic: r.topic.clone().unwrap_or_default(),
            status,
            status_class,
            retries: format!("{}/{}", r.retry_count, r.max_retry_count),
            created: When::new(r.create_time, now),
            published: When::opt(r.published_time, now),
            next_retry: When::opt(
                r.next_retry_time
                    .filter(|_| r.publish_status == EventStatus::Failed),
                now,
            ),
            fail_reason: r.fail_reason.clone().unwrap_or_default(),
            blocking: false,
            unpublished: matches!(
                r.publish_status,
                EventStatus::Pending | EventStatus::InProgress | EventStatus::Failed
            ),
            failed: r.publish_status == EventStatus::Failed,
        }
    }
}

/// `path?k=v&...`, each value percent-encoded, empty values left out.
pub(crate) fn link(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if !v.is_empty() {
            query.append_pair(k, v);
        }
    }
    let query = query.finish();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{query}")
    }
}

/// One bar of the chart: published stacked over failed.
#[derive(Debug, Clone)]
pub(crate) struct Bar {
    pub(crate) x: u32,
    pub(crate) published_y: u32,
    pub(crate) published_h: u32,
    pub(crate) failed_y: u32,
    pub(crate) failed_h: u32,
    pub(crate) title: String,
}

/// The published / failed per minute chart, as SVG shapes.
#[derive(Debug, Clone)]
pub(crate) struct Chart {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) bars: Vec<Bar>,
    pub(crate) peak: i64,
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) published: i64,
    pub(crate) failed: i64,
}

/// Bars 3 px wide, one per minute of the last `minutes`, the highest minute at full height.
pub(crate) fn chart(series: &[MinuteCount], now: DateTime<Utc>, minutes: i64) -> Chart {
    const BAR: u32 = 3;
    const HEIGHT: u32 = 120;
    let start = now - TimeDelta::minutes(minutes);
    let peak = series
        .iter()
        .map(|m| m.published + m.failed)
        .max()
        .unwrap_or(0)
        .max(1);
    let scale = |n: i64| -> u32 {
        let h = (n as f64 / peak as f64 * f64::from(HEIGHT)).round();
        (h as u32).min(HEIGHT)
    };
    let mut bars = Vec::new();
    for m in series {
        let offset = (m.minute - start).num_minutes();
        if offset < 0 || offset >= minutes {
            continue;
        }
        let total_h = scale(m.published + m.failed).max(1);
        let failed_h = scale(m.failed).min(total_h);
        let published_h = total_h - failed_h;
        bars.push(Bar {
            x: u32::try_from(offset).unwrap_or(0) * BAR,
            published_y: HEIGHT - total_h,
            published_h,
            failed_y: HEIGHT - failed_h,
            failed_h,
            title: format!(
                "{}: {} published, {} failed",
                m.minute.format("%H:%M UTC"),
                m.published,
                m.failed
            ),
        });
    }
    Chart {
        width: u32::try_from(minutes).unwrap_or(180) * BAR,
        height: HEIGHT,
        bars,
        peak,
        from: start.format("%H:%M").to_string(),
        to: now.format("%H:%M UTC").to_string(),
        published: series.iter().map(|m| m.published).sum(),
        failed: series.iter().map(|m| m.failed).sum(),
    }
}

/// Pretty JSON, or the text as it is.
pub(crate) fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// Reads a time from a form: `2026-11-30T13:45` (as a datetime-local field sends it, taken as
/// UTC), with seconds, or RFC 3339.
pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    for format in [
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%d %H:%M:%S",
    ] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(text, format) {
            return Ok(t.and_utc());
        }
    }
    if let Ok(d) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d") {
        return Ok(d.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc());
    }
    Err(format!(
        "`{text}` is not a time: write 2026-11-30T13:45 (UTC) or an RFC 3339 time"
    ))
}

/// A page cursor: `<microseconds since the epoch>_<id>` of the last row shown.
pub(crate) fn cursor(r: &OutboxRecord) -> String {
    format!("{}_{}", r.create_time.timestamp_micros(), r.id)
}

/// Reads a page cursor.
pub(crate) fn parse_cursor(text: &str) -> Option<(DateTime<Utc>, i64)> {
    let (micros, id) = text.split_once('_')?;
    let at = DateTime::<Utc>::from_timestamp_micros(micros.parse().ok()?)?;
    Some((at, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = Utc::now();
        assert_eq!(relative(now - TimeDelta::seconds(5), now), "5 s ago");
        assert_eq!(relative(now - TimeDelta::minutes(3), now), "3 min ago");
        assert_eq!(relative(now - TimeDelta::hours(5), now), "5 h ago");
        assert_eq!(relative(now - TimeDelta::days(3), now), "3 d ago");
        assert_eq!(relative(now + TimeDelta::minutes(2), now), "in 2 min");
    }

    #[test]
    fn times_and_cursors_parse_and_bad_ones_say_why() {
        assert!(parse_time("2026-11-30T13:45").is_ok());
        assert!(parse_time("2026-11-30T13:45:00Z").is_ok());
        assert!(
            parse_time("yesterday")
                .unwrap_err()
                .contains("2026-11-30T13:45")
        );
        let at = DateTime::<Utc>::from_timestamp_micros(1_700_000_000_123_456).unwrap_or_default();
        assert_eq!(parse_cursor("1700000000123456_42"), Some((at, 42)));
        assert_eq!(parse_cursor("x_1"), None);
    }

    #[test]
    fn links_encode_their_values() {
        assert_eq!(
            link("/event", &[("no", "ORDER_PAID:o-1&x=<y>"), ("z", "")]),
            "/event?no=ORDER_PAID%3Ao-1%26x%3D%3Cy%3E"
        );
    }
}
