"""Where the code runs and keeps its files: what differs between the embedded default and a cluster
(``resources``), file I/O on a local path or any filesystem URL (``fsutil``), the one place a SparkSession is
made (``spark``), the native cluster (``cluster``), the Spark Connect server (``connect_server``), the JVM helper
(``jvm``), thread pools, and the bytecode of Spark's Python workers (``sparkzip``)."""
