#!/usr/bin/env python3
"""A CloudEvents peer written as a Python service would write it: the CloudEvents Python SDK's
own protocol bindings (kafka, rabbitmq, and http for the ce- headers of NATS) with each broker's
own Python client (confluent-kafka, pika, nats-py).

    ce_peer.py read --broker B --url U --mode M --count N [--topic T | --queue Q | --stream S --subject X]
        prints one JSON object per event read: {"mode", "attributes", "data", "key"}
    ce_peer.py publish --broker B --url U --mode M [--topic T | --exchange E --routing-key K | --subject X]
        publishes one CloudEvent per JSON line of stdin: {"attributes": {...}, "data": ...}

The cross-language tests in tests/cloudevents.rs run it; tests/python/requirements.txt pins
what it imports.
"""

import argparse
import asyncio
import json
import sys
import time
import uuid
from datetime import datetime

from dateutil.parser import isoparse

from cloudevents.core.bindings import http as ce_http
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.bindings import rabbitmq as ce_rabbitmq
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

FORMAT = JSONFormat()


def as_json(event, mode, key=None):
    attributes = {}
    for name, value in event.get_attributes().items():
        if isinstance(value, datetime):
            text = value.isoformat()
            if text.endswith("+00:00"):
                text = text[:-6] + "Z"
            attributes[name] = text
        else:
            attributes[name] = value
    data = event.get_data()
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8")
    return {"mode": mode, "attributes": attributes, "data": data, "key": key}


def emit(record):
    print(json.dumps(record), flush=True)


def text(value):
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def encode(binding, mode, event):
    """The event as the binding writes it in mode `binary` or `structured`."""
    write = binding.to_binary if mode == "binary" else binding.to_structured
    return write(event, FORMAT)


def to_event(line):
    spec = json.loads(line)
    attributes = dict(spec["attributes"])
    if "time" in attributes:
        attributes["time"] = isoparse(attributes["time"])
    return CloudEvent(attributes, spec.get("data"))


# --- Kafka ------------------------------------------------------------------------------------


def mode_of(content_type):
    """The content mode a message's content type says."""
    structured = (content_type or "").lower().startswith("application/cloudevents")
    return "structured" if structured else "binary"


def collect(args, receive):
    """Calls receive() for records until args.count are read or args.timeout passes."""
    deadline = time.monotonic() + args.timeout
    read = 0
    while read < args.count and time.monotonic() < deadline:
        for record in receive():
            emit(record)
            read += 1
    return read


def kafka_read(args):
    """Reads every partition of the topic from its start. Partitions are assigned, not taken
    through a consumer group: the read needs no group, and joining one can take the broker many
    seconds."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": args.url,
            "group.id": f"ce-peer-{uuid.uuid4()}",
            "enable.auto.commit": False,
        }
    )
    topics = consumer.list_topics(args.topic, timeout=args.timeout).topics
    found = topics.get(args.topic)
    if found is None or found.error is not None or not found.partitions:
        raise SystemExit(f"Kafka: no partitions for topic {args.topic}: {found and found.error}")
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in found.partitions])

    def receive():
        msg = consumer.poll(0.5)
        if msg is None:
            return []
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return []
            raise SystemExit(f"Kafka: {msg.error()}")
        headers = {name: value for name, value in (msg.headers() or [])}
        mode = mode_of(text(headers.get("content-type", b"")))
        message = ce_kafka.KafkaMessage(headers=headers, key=msg.key(), value=msg.value())
        event = ce_kafka.from_kafka(message, FORMAT)
        return [as_json(event, mode, text(msg.key()) if msg.key() is not None else None)]

    try:
        return collect(args, receive)
    finally:
        consumer.close()


def kafka_publish(args, events):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": args.url})
    failures = []

    def delivered(err, _msg):
        if err is not None:
            failures.append(str(err))

    for event in events:
        message = encode(ce_kafka, args.mode, event)
        producer.produce(
            args.topic,
            key=message.key,
            value=message.value,
            headers=list(message.headers.items()),
            on_delivery=delivered,
        )
    left = producer.flush(args.timeout)
    if left or failures:
        raise SystemExit(f"Kafka: {left} undelivered, failures {failures}")


# --- RabbitMQ ---------------------------------------------------------------------------------


def rabbitmq_read(args):
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()

    def receive():
        method, properties, body = channel.basic_get(args.queue, auto_ack=True)
        if method is None:
            time.sleep(0.1)
            return []
        headers = {name: text(value) for name, value in (properties.headers or {}).items()}
        message = ce_rabbitmq.RabbitMQMessage(
            headers=headers, content_type=properties.content_type, body=body
        )
        event = ce_rabbitmq.from_rabbitmq(message, FORMAT)
        return [as_json(event, mode_of(properties.content_type))]

    try:
        return collect(args, receive)
    finally:
        connection.close()


def rabbitmq_publish(args, events):
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(args.url))
    channel = connection.channel()
    channel.confirm_delivery()
    try:
        for event in events:
            message = encode(ce_rabbitmq, args.mode, event)
            channel.basic_publish(
                exchange=args.exchange,
                routing_key=args.routing_key,
                body=message.body,
                properties=pika.BasicProperties(
                    headers=message.headers,
                    content_type=message.content_type,
                    delivery_mode=2,
                ),
                mandatory=True,
            )
    finally:
        connection.close()


# --- NATS JetStream ---------------------------------------------------------------------------


async def nats_read(args):
    import nats

    nc = await nats.connect(args.url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(args.subject, durable=None, stream=args.stream)
    deadline = time.monotonic() + args.timeout
    read = 0
    try:
        while read < args.count and time.monotonic() < deadline:
            try:
                batch = await sub.fetch(args.count - read, timeout=1)
            except nats.errors.TimeoutError:
                continue
            for msg in batch:
                headers = dict(msg.headers or {})
                content_type = next(
                    (v for k, v in headers.items() if k.lower() == "content-type"), ""
                )
                mode = mode_of(content_type)
                event = ce_http.from_http(ce_http.HTTPMessage(headers=headers, body=msg.data), FORMAT)
                emit(as_json(event, mode))
                await msg.ack()
                read += 1
    finally:
        await nc.close()
    return read


async def nats_publish(args, events):
    import nats

    nc = await nats.connect(args.url)
    js = nc.jetstream()
    try:
        for event in events:
            message = encode(ce_http, args.mode, event)
            await js.publish(args.subject, message.body, headers=message.headers)
    finally:
        await nc.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["read", "publish"])
    parser.add_argument("--broker", required=True, choices=["kafka", "rabbitmq", "nats"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--mode", required=True, choices=["binary", "structured"])
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30)
    parser.add_argument("--topic")
    parser.add_argument("--queue")
    parser.add_argument("--exchange", default="")
    parser.add_argument("--routing-key", default="")
    parser.add_argument("--stream")
    parser.add_argument("--subject")
    args = parser.parse_args()

    if args.action == "read":
        if args.broker == "kafka":
            read = kafka_read(args)
        elif args.broker == "rabbitmq":
            read = rabbitmq_read(args)
        else:
            read = asyncio.run(nats_read(args))
        if read < args.count:
            raise SystemExit(f"read {read} of {args.count} events within {args.timeout} s")
    else:
        events = [to_event(line) for line in sys.stdin if line.strip()]
        if args.broker == "kafka":
            kafka_publish(args, events)
        elif args.broker == "rabbitmq":
            rabbitmq_publish(args, events)
        else:
            asyncio.run(nats_publish(args, events))


if __name__ == "__main__":
    main()
