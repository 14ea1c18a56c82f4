"""Settings from the environment: good values load, every bad one is a one-line error naming the setting."""

from __future__ import annotations

import pytest

from reminder_pipeline.config import ConfigError, Settings


def test_defaults_use_the_embedded_servers(tmp_path):
    settings = Settings.from_env({"REMINDER_PIPELINE_HOME": str(tmp_path)})
    assert settings.embedded
    assert settings.batch_size == 200
    assert settings.home == tmp_path.resolve()


def test_production_settings_build_a_librdkafka_config():
    settings = Settings.from_env(
        {
            "DATABASE_URL": "postgresql+psycopg://app:pw@db:5432/calendar",
            "KAFKA_BOOTSTRAP_SERVERS": "k1:9092, k2:9092",
            "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_USERNAME": "calendar",
            "KAFKA_SASL_PASSWORD": "secret",
        }
    )
    assert not settings.embedded
    config = settings.kafka().client_config()
    assert config["bootstrap.servers"] == "k1:9092,k2:9092"
    assert config["security.protocol"] == "SASL_SSL"
    assert config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert "secret" not in repr(settings.kafka())


@pytest.mark.parametrize(
    ("env", "setting"),
    [
        ({"DATABASE_URL": "mysql://x@y/z"}, "DATABASE_URL"),
        ({"DATABASE_URL": "not a url"}, "DATABASE_URL"),
        ({"DATABASE_URL": "postgresql+asyncpg://x@y/z"}, "DATABASE_URL"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "localhost"}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": "localhost:99999"}, "KAFKA_BOOTSTRAP_SERVERS"),
        ({"KAFKA_BOOTSTRAP_SERVERS": " , "}, "KAFKA_BOOTSTRAP_SERVERS"),
        (
            {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "KAFKA_SECURITY_PROTOCOL": "TLS"},
            "KAFKA_SECURITY_PROTOCOL",
        ),
        (
            {
                "KAFKA_BOOTSTRAP_SERVERS": "k:9092",
                "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "KAFKA_SASL_MECHANISM": "GSSAPI",
                "KAFKA_SASL_USERNAME": "u",
                "KAFKA_SASL_PASSWORD": "p",
            },
            "KAFKA_SASL_MECHANISM",
        ),
        (
            {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
            "KAFKA_SASL_USERNAME",
        ),
        (
            {"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "KAFKA_SASL_MECHANISM": "PLAIN"},
            "KAFKA_SASL_MECHANISM",
        ),
        ({"REMINDER_BATCH_SIZE": "two hundred"}, "REMINDER_BATCH_SIZE"),
        ({"REMINDER_BATCH_SIZE": "0"}, "REMINDER_BATCH_SIZE"),
        ({"REMINDER_BATCH_SIZE": "1000000"}, "REMINDER_BATCH_SIZE"),
        ({"REMINDER_CYCLE_BUDGET_SECONDS": "soon"}, "REMINDER_CYCLE_BUDGET_SECONDS"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_setting(env, setting):
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    message = str(info.value)
    assert setting in message
    assert "\n" not in message
