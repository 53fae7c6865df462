"""Code shared by the Lambda functions, the GPU worker and the local deployment."""
