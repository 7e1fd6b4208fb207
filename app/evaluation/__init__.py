"""Evaluation of an exported model: metrics, figures and an HTML report.

One implementation behind two front ends (scripts/evaluate.py and notebooks/evaluate.ipynb):

    from app.evaluation.evaluate import evaluate
    result = evaluate("runs/demo", "datasets/demo/tfrecords", split="test")
"""
