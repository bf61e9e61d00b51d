"""rler"""
