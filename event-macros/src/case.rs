//! The default event type: the type name in SCREAMING_SNAKE_CASE.

/// `OrderPaid` -> `ORDER_PAID`, `HTTPRequestSent` -> `HTTP_REQUEST_SENT`, `Order2Paid` -> `ORDER2_PAID`.
pub(crate) fn screaming_snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().collect();
    let mut out = String::with_capacity(name.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        if c.is_uppercase() && i > 0 {
            let prev = chars[i - 1];
            let next_is_lower = chars.get(i + 1).is_some_and(|n| n.is_lowercase());
            let boundary = prev.is_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_uppercase() && next_is_lower);
            if boundary && prev != '_' {
                out.push('_');
            }
        }
        out.extend(c.to_uppercase());
    }
    out
}

/// Checks a name against `[A-Za-z][A-Za-z0-9_.-]{0,63}`, the shape of `event_type` and
/// `aggregate_type` values (they are stored in VARCHAR(64) columns and used in broker subjects).
pub(crate) fn check_type_name(value: &str) -> Result<(), String> {
    let mut chars = value.chars();
    match chars.next() {
        None => return Err("is empty".to_owned()),
        Some(first) if !first.is_ascii_alphabetic() => {
            return Err(format!("must start with an ASCII letter, not `{first}`"));
        }
        Some(_) => {}
    }
    if let Some(bad) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')))
    {
        return Err(format!(
            "contains `{bad}`; only ASCII letters, digits, `_`, `.` and `-` are allowed"
        ));
    }
    if value.len() > 64 {
        return Err(format!(
            "is {} characters long; the limit is 64",
            value.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_type_names() {
        assert_eq!(screaming_snake_case("OrderPaid"), "ORDER_PAID");
        assert_eq!(screaming_snake_case("HTTPRequestSent"), "HTTP_REQUEST_SENT");
        assert_eq!(screaming_snake_case("Order2Paid"), "ORDER2_PAID");
        assert_eq!(screaming_snake_case("Paid"), "PAID");
        assert_eq!(screaming_snake_case("Order_Paid"), "ORDER_PAID");
        assert_eq!(screaming_snake_case("V2Event"), "V2_EVENT");
    }

    #[test]
    fn checks_type_names() {
        assert!(check_type_name("ORDER_PAID").is_ok());
        assert!(check_type_name("order.paid-v2").is_ok());
        assert!(check_type_name(&"A".repeat(64)).is_ok());
        assert!(check_type_name(&"A".repeat(65)).is_err());
        assert!(check_type_name("").is_err());
        assert!(check_type_name("1ORDER").is_err());
        assert!(check_type_name("ORDER PAID").is_err());
        assert!(check_type_name("订单").is_err());
    }
}
