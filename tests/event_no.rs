//! The event number: deterministic, at most 64 bytes, collision-free in practice, and pinned to
//! outputs computed outside this code (`printf '%s' TEXT | sha256sum`), so a change to the
//! encoding cannot slip through.

use std::collections::HashSet;

use event_core::EventNo;
use proptest::prelude::*;

#[test]
fn short_renderings_are_kept_as_they_are() {
    for text in ["ORDER_PAID:o-1", "x", "", &"A".repeat(64)] {
        assert_eq!(EventNo::from_rendered(text).as_str(), text);
    }
}

#[test]
fn sixty_five_bytes_is_the_first_length_that_is_shortened() {
    let text = "B".repeat(65);
    let no = EventNo::from_rendered(&text);
    assert_ne!(no.as_str(), text);
    assert_eq!(no.as_str().len(), 64);
}

#[test]
fn long_renderings_are_pinned() {
    let cases = [
        (
            format!("ORDER_PAID:{}", "9".repeat(80)),
            "ORDER_PAID:999999999999999999999999999999999999#45b42017279d5ad5",
        ),
        (
            "ORDER_PAID:ORDER:customer-0123456789abcdef-0123456789abcdef-0123456789:1".to_owned(),
            "ORDER_PAID:ORDER:customer-0123456789abcdef-0123#a0a89a1b89ec8f00",
        ),
        (
            // Multi-byte text is cut on a character boundary, never inside a character.
            "订单已支付:订单编号二零二六零五一三零零零一:聚合:订单".to_owned(),
            "订单已支付:订单编号二零二六零五#3680c600c24d4fe1",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(
            EventNo::from_rendered(&text).as_str(),
            expected,
            "for {text:?}"
        );
    }
}

#[test]
fn no_collisions_among_100k_distinct_inputs() {
    // Long inputs that share their readable prefix, so only the hash tells them apart, plus
    // short ones that are kept verbatim.
    let mut seen = HashSet::with_capacity(100_000);
    for i in 0..100_000u32 {
        let text = if i % 2 == 0 {
            format!(
                "ORDER_PAID:ORDER:{}:{i}",
                "customer-with-a-long-identifier-".repeat(2)
            )
        } else {
            format!("ORDER_PAID:{i}")
        };
        let no = EventNo::from_rendered(&text);
        assert!(seen.insert(no.clone()), "collision at {text:?} -> {no}");
    }
    assert_eq!(seen.len(), 100_000);
}

proptest! {
    #[test]
    fn deterministic_and_bounded(text in ".{0,300}") {
        let first = EventNo::from_rendered(&text);
        let second = EventNo::from_rendered(&text.clone());
        prop_assert_eq!(&first, &second);
        prop_assert!(first.as_str().len() <= EventNo::MAX_LEN);
        prop_assert!(first.as_str().chars().count() <= 64);
        if text.len() <= EventNo::MAX_LEN {
            prop_assert_eq!(first.as_str(), text.as_str());
        } else {
            // The readable prefix is a prefix of the text.
            let (prefix, hash) = first.as_str().rsplit_once('#').expect("a shortened number has a `#`");
            prop_assert!(text.starts_with(prefix));
            prop_assert_eq!(hash.len(), 16);
            prop_assert!(hash.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        }
    }

    #[test]
    fn distinct_long_inputs_stay_distinct(a in ".{65,200}", b in ".{65,200}") {
        prop_assume!(a != b);
        prop_assert_ne!(EventNo::from_rendered(&a), EventNo::from_rendered(&b));
    }
}
