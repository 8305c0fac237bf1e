"""Exports of the store to where teams already look (OTLP)."""
