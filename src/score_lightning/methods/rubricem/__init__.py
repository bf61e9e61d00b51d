"""rubricem"""
