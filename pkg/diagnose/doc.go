// Package diagnose answers an operator's questions about this driver's
// volumes from objects already gathered: why a pod's volume does not
// attach (Why), what is wrong cluster-wide (Check), and whether a node's
// claim may be released by hand (PlanRelease).
//
// Every judgement here is pure: it reads a Cluster (the API objects, the
// RDS inventory and the RDS's health kubectl rds fetched) and makes no API
// or RDS call, so every verdict is table-tested. FetchRDSHealth is the
// gatherer's: it reads the controller's /metrics, never the RDS. It must never decide anything the driver's
// publish policy decides; it only explains the state and names the one next
// step for the operator.
package diagnose
