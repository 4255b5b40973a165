"""A minimal PyFlink job: copy every record of one Kafka topic to another (raw bytes).

Used by the foundation test to prove the PyFlink <-> Kafka connector pair works on the cluster.
Arguments: BOOTSTRAP SOURCE_TOPIC SINK_TOPIC GROUP_ID
"""

import sys

from pyflink.table import EnvironmentSettings, TableEnvironment


def main(bootstrap: str, source: str, sink: str, group: str) -> None:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("pipeline.name", f"copy-{source}")
    env.execute_sql(f"""
        CREATE TABLE src (line BYTES) WITH (
          'connector' = 'kafka', 'topic' = '{source}',
          'properties.bootstrap.servers' = '{bootstrap}',
          'properties.group.id' = '{group}',
          'scan.startup.mode' = 'earliest-offset', 'format' = 'raw')""")
    env.execute_sql(f"""
        CREATE TABLE dst (line BYTES) WITH (
          'connector' = 'kafka', 'topic' = '{sink}',
          'properties.bootstrap.servers' = '{bootstrap}', 'format' = 'raw')""")
    env.execute_sql("INSERT INTO dst SELECT line FROM src")


if __name__ == "__main__":
    main(*sys.argv[1:5])
