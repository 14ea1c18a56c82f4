"""The Kafka side: the producer, the topic, and the outbox relay."""
