#!/usr/bin/env bash
# Machine-to-machine access to the reminder topics (docker/compose.yaml, service kafka-access).
#
# Creates the dead-letter topic, one SASL/SCRAM-SHA-512 user per application and the ACLs that
# allow exactly what each one does; the broker denies everything else
# (allow.everyone.if.no.acl.found=false). Idempotent: safe to run on every `compose up`.
#
#   reminder-dispatcher   the outbox relay: Write (and Describe) pin.calendar.reminder-due.v1.
#                         Kafka >= 3.0 lets a principal with Write on a topic use the idempotent
#                         producer, so no cluster-level IdempotentWrite is granted.
#   notifications         the notifications consumer: Read (and Describe) the topic, Read its
#                         consumer group, Write (and Describe) pin.calendar.reminder-due.v1.dlq.
#
# Talks to the broker as the super user `admin` over the internal listener. Passwords come from
# the environment (KAFKA_*_PASSWORD in compose); they must not contain ',' or ']' (the
# kafka-configs.sh syntax of SCRAM credentials).
set -euo pipefail

bin=${KAFKA_BIN:-/opt/kafka/bin}
bootstrap=${KAFKA_ADMIN_BOOTSTRAP:?}
admin_config=${KAFKA_ADMIN_CONFIG:?}
topic=${REMINDER_TOPIC:?}
dlq_topic=${REMINDER_DLQ_TOPIC:?}
partitions=${REMINDER_TOPIC_PARTITIONS:?}
dispatcher=${DISPATCHER_USER:?}
notifications=${NOTIFICATIONS_USER:?}
notifications_group=${NOTIFICATIONS_GROUP:?}
: "${DISPATCHER_PASSWORD:?}" "${NOTIFICATIONS_PASSWORD:?}"

admin() {
  local tool=$1
  shift
  "$bin/$tool" --bootstrap-server "$bootstrap" --command-config "$admin_config" "$@"
}

scram_user() {
  admin kafka-configs.sh --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$2]"
}

allow() {
  admin kafka-acls.sh --add --allow-principal "User:$1" "${@:2}"
}

# The consumer writes dead letters here; like the main topic (kafka-init), it is created
# explicitly with the contract's partition count: auto-creation is off.
admin kafka-topics.sh --create --if-not-exists --topic "$dlq_topic" \
  --partitions "$partitions" --replication-factor 1

scram_user "$dispatcher" "$DISPATCHER_PASSWORD"
scram_user "$notifications" "$NOTIFICATIONS_PASSWORD"

allow "$dispatcher" --operation Write --operation Describe \
  --topic "$topic" --resource-pattern-type literal

allow "$notifications" --operation Read --operation Describe \
  --topic "$topic" --resource-pattern-type literal
allow "$notifications" --operation Read \
  --group "$notifications_group" --resource-pattern-type literal
allow "$notifications" --operation Write --operation Describe \
  --topic "$dlq_topic" --resource-pattern-type literal

echo "kafka-access: users $dispatcher, $notifications and their ACLs are in place"
