// Our own module that pins the scheduler projects whose CRDs the local cluster
// installs (KAI, Volcano, Kueue). Nothing is built from it: `go mod download`
// brings each module's zip into the module cache and the CRD YAML is read from
// there (jupyterhub_gpu/localcluster/crds.py). Versions are ones the module
// proxy serves; each zip is checked to hold its CRDs.
module jupyterhub-gpu.local/controlplane/crds

go 1.26.0

require (
	github.com/NVIDIA/KAI-scheduler v0.12.0
	sigs.k8s.io/kueue v0.19.2
	volcano.sh/volcano v1.10.0
)
