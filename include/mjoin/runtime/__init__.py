"""Where the code runs: Spark sessions, the native cluster, the Spark Connect server, the JVM helper, resources."""
