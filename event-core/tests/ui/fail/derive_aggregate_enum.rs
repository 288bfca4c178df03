use event_core::Aggregate;

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
enum Order {
    Open,
}

#[derive(Aggregate)]
#[aggregate(type = "ORDER")]
struct Tuple(String);

fn main() {}
