"""The λ-GELU lab: tasks on real offline data, the ReLU-ization protocol's arms, a resumable
results store and the report. Built on the ``lambda_gelu`` library, which never imports it."""
