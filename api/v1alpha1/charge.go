package v1alpha1

// AdmittedChargeAnnotation records, on an admitted pod, what its claims
// were charged when it was admitted ("memory=<bytes>,gpus=<micro-GPUs>",
// every claim of the pod counted whole). The controller writes it with the
// gate's removal (and with the decision of a workload of several pods) and
// compares it with what the pod's claims really hold: a pod that holds more
// is checked against its queue's limits again and evicted when over them.
const AdmittedChargeAnnotation = "tessera.dev/admitted-charge"
