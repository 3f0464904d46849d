"""The re-optimization loop as Airflow runs it: the steps, the DAG params, trigger checks, Airflow's environment, the UI views."""
