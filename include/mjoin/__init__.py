"""mjoin: runtime-optimized multi-way stream joins on Apache Spark, re-planned by Airflow.

The parts, top to bottom (each imports only the parts below it; docs/design.md, "Packages and layers"):
``commands`` (the CLI), ``loop`` (the re-optimization steps Airflow runs), ``evaluation``, ``gates``,
``optimizer`` and ``forecast`` (pure logic), ``stats`` and ``engine`` (Spark), ``workloads``, ``lake``,
``model`` (the formats every part shares) and ``runtime`` (where the code runs). The DAGs in ``dags/`` only wire.
"""
__version__ = "0.1.0"
