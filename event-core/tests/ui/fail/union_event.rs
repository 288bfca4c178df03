use event_core::DomainEvent;

#[derive(DomainEvent)]
union OrderPaid {
    amount_minor: i64,
    amount_cents: u64,
}

fn main() {}
