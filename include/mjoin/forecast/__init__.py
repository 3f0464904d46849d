"""One-step-ahead forecasts of the statistics (Holt smoothing) and the range a forecast may take."""
