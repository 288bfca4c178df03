use event_core::Aggregate;

#[derive(Aggregate)]
struct NoType {
    #[aggregate(id)]
    id: String,
    events: event_core::RecordedEvents,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
struct NoIdNoEvents {
    id: String,
}

#[derive(Aggregate)]
#[aggregate(type = "9ORDER", kind = "x")]
struct Mistakes {
    #[aggregate(id)]
    a: String,
    #[aggregate(id, key)]
    b: String,
    events: event_core::RecordedEvents,
}

fn main() {}
