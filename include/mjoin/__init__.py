"""mjoin: runtime-optimized multi-way stream joins on Apache Spark.

Pure core (no Spark, no Airflow): ``query``, ``statistics``, ``plan``,
``partition``, ``cost``, ``optimize``, ``forecast``, ``gates``.
Spark parts: ``engine``, ``stats``. Orchestration lives in ``dags/``.
"""
__version__ = "0.1.0"
