"""Key-to-group rules give the same groups in numpy and in Spark SQL."""
import numpy as np
import pytest

from mjoin.model.keygroups import group_of, num_groups, rule_problems, sql_group_expr

RULES = [
    None,
    {"method": "hash", "attr_class": "c0", "groups": 3},
    {"method": "range", "attr_class": "c0", "bounds": [10, 100, 1000]},
    {"method": "table", "attr_class": "c0", "modulus": 5, "assignment": [1, 0, 0, 2, 1]},
]
KEYS = np.array([-7, -1, 0, 1, 9, 10, 11, 99, 100, 999, 1000, 123456789], dtype=np.int64)


@pytest.mark.parametrize("rule", RULES)
def test_numpy_groups_in_range(rule):
    g = group_of(KEYS, rule)
    assert g.min() >= 0 and g.max() < num_groups(rule)


def test_known_values():
    assert group_of([-7, 7], RULES[1]).tolist() == [2, 1]  # non-negative modulo
    assert group_of([9, 10, 99, 100, 5000], RULES[2]).tolist() == [0, 1, 1, 2, 3]
    assert group_of([0, 1, 3, 8], RULES[3]).tolist() == [1, 0, 2, 2]


def test_rule_problems(seed_query, two_class_query):
    assert rule_problems(RULES[1], seed_query) == []
    assert "not a class" in rule_problems({"method": "hash", "attr_class": "c7", "groups": 2}, seed_query)[0]
    assert "sr are not" in rule_problems({"method": "hash", "attr_class": "c1", "groups": 2}, two_class_query)[0]
    assert "strictly increasing" in rule_problems({"method": "range", "attr_class": "c0", "bounds": [5, 5]}, seed_query)[0]


@pytest.mark.spark
@pytest.mark.parametrize("rule", RULES)
def test_spark_sql_agrees_with_numpy(spark, rule):
    df = spark.createDataFrame([(int(k),) for k in KEYS], "k long")
    got = [r[0] for r in df.selectExpr(f"{sql_group_expr('k', rule)} AS g").collect()]
    assert got == group_of(KEYS, rule).tolist()


@pytest.mark.spark
@pytest.mark.parametrize("rule", RULES[1:])
def test_spark_sql_null_key_has_no_group(spark, rule):
    df = spark.createDataFrame([(None,), (5,)], "k long")
    got = [r[0] for r in df.selectExpr(f"{sql_group_expr('k', rule)} AS g").collect()]
    assert got[0] is None and got[1] == int(group_of([5], rule)[0])
