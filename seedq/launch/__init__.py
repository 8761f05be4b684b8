"""Launchers for engines users already run: Kubernetes manifests (`k8s`) and
`gcloud` TPU/GPU VM command plans (`gcloud`). Both are small pure render
functions over the run config; nothing here talks to a cloud by itself except
`gcloud.run_plan`, which runs the commands a plan printed."""
