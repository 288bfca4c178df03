//! The serde profile on schemas of real derived types: each case is a payload change a team
//! makes, and the verdict serde would give when a new reader meets old data (BACKWARD) or an old
//! reader meets new data (FORWARD).

// A panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use event_core::DomainEvent;
use event_core::schema::{Mode, Profile, check_with};
use serde::{Deserialize, Serialize};
use serde_json::Value;

fn schema<E: DomainEvent>() -> Value {
    serde_json::to_value(E::event_schema()).unwrap()
}

/// Whether readers of `mode` keep working from `A` to `B`.
fn compatible<A: DomainEvent, B: DomainEvent>(mode: Mode) -> bool {
    let report = check_with(&schema::<A>(), &schema::<B>(), mode, Profile::Serde).unwrap();
    report.is_compatible()
}

macro_rules! event {
    ($name:ident { $($body:tt)* }) => {
        #[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
        #[domain_event(event_type = "CASE")]
        #[allow(dead_code)]
        struct $name { $($body)* }
    };
    (#[$attr:meta] $name:ident { $($body:tt)* }) => {
        #[derive(Serialize, Deserialize, schemars::JsonSchema, DomainEvent)]
        #[domain_event(event_type = "CASE")]
        #[$attr]
        #[allow(dead_code)]
        struct $name { $($body)* }
    };
}

event!(Base {
    id: String,
    amount: i32
});
event!(WithOption { id: String, amount: i32, note: Option<String> });
event!(WithRequired {
    id: String,
    amount: i32,
    currency: String
});
event!(WithDefault {
    id: String,
    amount: i32,
    #[serde(default)]
    priority: u8
});
event!(WithoutAmount { id: String });
event!(AmountI64 {
    id: String,
    amount: i64
});
event!(AmountF64 {
    id: String,
    amount: f64
});
event!(AmountI16 {
    id: String,
    amount: i16
});
event!(AmountOption { id: String, amount: Option<i32> });
event!(Renamed {
    id: String,
    total: i32
});
event!(RenamedWithAlias {
    id: String,
    #[serde(alias = "amount")]
    total: i32
});
event!(
    #[serde(rename_all = "camelCase")]
    RenamedCamel {
        id: String,
        #[serde(alias = "amount")]
        amount_total: i32
    }
);
event!(RenamedNarrowed {
    id: String,
    #[serde(alias = "amount")]
    total: i16
});
event!(
    #[serde(deny_unknown_fields)]
    Strict {
        id: String,
        amount: i32
    }
);
event!(
    #[serde(deny_unknown_fields)]
    StrictWithoutAmount { id: String }
);
event!(
    /// A payment was booked.
    Documented {
        /// The order.
        id: String,
        /// In minor units.
        amount: i32
    }
);
event!(Counter32 { count: u32 });
event!(Counter64 { count: u64 });
event!(MapI32 { totals: HashMap<String, i32> });
event!(MapI64 { totals: HashMap<String, i64> });

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Address {
    street: String,
    zip: String,
}
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct AddressNumericZip {
    street: String,
    zip: u32,
}
event!(Shipping {
    id: String,
    to: Address
});
event!(ShippingNumericZip {
    id: String,
    to: AddressNumericZip
});

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
enum Colour {
    Red,
    Green,
}
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
enum ColourPlus {
    Red,
    Green,
    Blue,
}
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
enum ColourMinus {
    Red,
}
event!(Paint { colour: Colour });
event!(PaintPlus { colour: ColourPlus });
event!(PaintMinus {
    colour: ColourMinus
});

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
enum Payment {
    Card { last4: String },
    Cash { amount: i64 },
}
#[derive(Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type")]
enum PaymentTagged {
    Card { last4: String },
    Cash { amount: i64 },
}
event!(Paid { payment: Payment });
event!(PaidTagged {
    payment: PaymentTagged
});

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Tree {
    label: String,
    children: Vec<Tree>,
}
event!(TreeChanged { root: Tree });

use Mode::{Backward, Forward, Full};

#[test]
fn adding_fields() {
    assert!(
        compatible::<Base, WithOption>(Full),
        "an Option field: old data lacks it (None), old readers ignore it"
    );
    assert!(
        !compatible::<Base, WithRequired>(Backward),
        "a required field: old data lacks it"
    );
    assert!(
        compatible::<Base, WithRequired>(Forward),
        "old readers ignore the new field"
    );
    assert!(
        compatible::<Base, WithDefault>(Full),
        "#[serde(default)] fills it in"
    );
}

#[test]
fn removing_fields() {
    assert!(
        compatible::<Base, WithoutAmount>(Backward),
        "new readers ignore the field old data carries"
    );
    assert!(
        !compatible::<Base, WithoutAmount>(Forward),
        "old readers require it"
    );
    assert!(
        compatible::<WithOption, Base>(Full),
        "an Option field can go both ways"
    );
}

#[test]
fn widening_and_narrowing_numbers() {
    assert!(compatible::<Base, AmountI64>(Backward), "i32 -> i64 widens");
    assert!(
        !compatible::<AmountI64, Base>(Backward),
        "i64 -> i32 narrows"
    );
    assert!(
        !compatible::<Base, AmountI16>(Backward),
        "i32 -> i16 narrows"
    );
    assert!(
        compatible::<Base, AmountF64>(Backward),
        "serde reads an integer as f64"
    );
    assert!(
        !compatible::<AmountF64, Base>(Backward),
        "a float is no i32"
    );
    assert!(
        compatible::<Counter32, Counter64>(Backward),
        "u32 -> u64 widens"
    );
    assert!(
        !compatible::<Counter64, Counter32>(Backward),
        "u64 -> u32 narrows"
    );
}

#[test]
fn making_a_field_optional() {
    assert!(
        compatible::<Base, AmountOption>(Backward),
        "T -> Option<T> reads every old value"
    );
    assert!(
        !compatible::<AmountOption, Base>(Backward),
        "Option<T> -> T rejects null"
    );
}

#[test]
fn enum_variants() {
    assert!(
        compatible::<Paint, PaintPlus>(Backward),
        "a new variant: old data uses old ones"
    );
    assert!(
        !compatible::<Paint, PaintMinus>(Backward),
        "a removed variant: old data may use it"
    );
    assert!(
        !compatible::<Paid, PaidTagged>(Backward),
        "another tag representation is another shape"
    );
}

#[test]
fn renaming_a_field_breaks_unless_the_new_name_accepts_the_old() {
    assert!(
        !compatible::<Base, Renamed>(Backward),
        "old data has `amount`, the reader requires `total`"
    );
    assert!(
        compatible::<Base, RenamedWithAlias>(Backward),
        "#[serde(alias = \"amount\")] reads old data"
    );
    assert!(
        compatible::<Base, RenamedCamel>(Backward),
        "the alias holds under rename_all too"
    );
    assert!(
        !compatible::<Base, RenamedNarrowed>(Backward),
        "the renamed field is still compared: i32 -> i16 narrows"
    );
    assert!(
        !compatible::<Base, RenamedWithAlias>(Forward),
        "old readers still require `amount`"
    );
    let schema = schema::<RenamedCamel>();
    assert_eq!(
        schema["properties"]["amountTotal"]["x-aliases"],
        serde_json::json!(["amount"])
    );
}

#[test]
fn nested_changes_are_found_through_defs() {
    let report = check_with(
        &schema::<Shipping>(),
        &schema::<ShippingNumericZip>(),
        Backward,
        Profile::Serde,
    )
    .unwrap();
    assert!(!report.is_compatible());
    assert!(
        report
            .breaking()
            .any(|f| f.rule.name() == "TYPE_CHANGED" && f.pointer.ends_with("/zip")),
        "{:?}",
        report.findings
    );
}

#[test]
fn deny_unknown_fields() {
    assert!(
        compatible::<Base, Strict>(Full),
        "closing the reader changes nothing while the fields are the same"
    );
    assert!(
        !compatible::<Strict, StrictWithoutAmount>(Backward),
        "a closed reader rejects the removed field in old data"
    );
}

#[test]
fn doc_comments_are_annotations() {
    assert!(compatible::<Base, Documented>(Full));
}

#[test]
fn map_values_widen() {
    assert!(compatible::<MapI32, MapI64>(Backward));
    assert!(!compatible::<MapI64, MapI32>(Backward));
}

#[test]
fn recursive_types_terminate() {
    assert!(compatible::<TreeChanged, TreeChanged>(Full));
}

#[test]
fn the_strict_profile_is_stricter_about_open_content() {
    // Strictly, Base's schema admits any extra property, so a reader that adds one typed field
    // may meet old data with that property as anything: a break. serde writers cannot do that.
    let strict = check_with(
        &schema::<Base>(),
        &schema::<WithOption>(),
        Backward,
        Profile::Strict,
    )
    .unwrap();
    assert!(!strict.is_compatible());
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
enum Status {
    /// Waiting for payment.
    Open,
    /// Paid.
    Paid,
}
event!(WithStatusPlain { status: Colour });
event!(WithStatusDocumented { status: Status });

#[test]
fn documenting_enum_variants_is_not_a_type_change() {
    // schemars writes `enum: [..]` for plain variants and `oneOf: [{const}, ..]` once they have doc
    // comments; both are the same set of values.
    let plain = serde_json::json!({"type": "object", "properties": {"s": {"type": "string", "enum": ["Open", "Paid"]}}});
    let documented = schema::<WithStatusDocumented>();
    let documented_status = documented["properties"]["status"].clone();
    let resolved = if let Some(r) = documented_status.get("$ref").and_then(|r| r.as_str()) {
        let name = r.rsplit('/').next().unwrap();
        documented["$defs"][name].clone()
    } else {
        documented_status
    };
    assert!(
        resolved.get("oneOf").is_some(),
        "schemars writes oneOf of const here: {resolved}"
    );
    let documented = serde_json::json!({"type": "object", "properties": {"s": resolved}});
    let serde = check_with(&plain, &documented, Full, Profile::Serde).unwrap();
    assert!(serde.is_compatible(), "{:?}", serde.findings);
    let one_more = serde_json::json!({"type": "object", "properties": {"s": {"oneOf": [{"const": "Open"}, {"const": "Paid"}, {"const": "Void"}]}}});
    assert!(
        check_with(&plain, &one_more, Backward, Profile::Serde)
            .unwrap()
            .is_compatible()
    );
    assert!(
        !check_with(&one_more, &plain, Backward, Profile::Serde)
            .unwrap()
            .is_compatible()
    );
    let numbers = |v: serde_json::Value| serde_json::json!({"enum": v});
    assert!(
        check_with(
            &numbers(serde_json::json!([1, 2])),
            &numbers(serde_json::json!([1.0, 2.0])),
            Full,
            Profile::Serde
        )
        .unwrap()
        .is_compatible()
    );
    let _ = schema::<WithStatusPlain>();
}
