/* profile_once.c - one layer profiled with the sampled ranking (ei_config_quality), random
   bf16 q and k, for perf and callgrind (docs/quality.md, "The sampled rows in int8").
   gcc -std=c99 -O2 -g -I../../.. profile_once.c -o profile_once -lm -lpthread -ldl
   ./profile_once n heads kv_heads dim precision(0 f32, 1 int8) rows reps threads [simd [i8dot bits]] */
#define _POSIX_C_SOURCE 200809L
#define ENTROPYINFER_IMPLEMENTATION
#include "entropyinfer.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc,char**argv){
  int n=atoi(argv[1]),H=atoi(argv[2]),KV=atoi(argv[3]),d=atoi(argv[4]),prec=atoi(argv[5]),R=atoi(argv[6]),reps=atoi(argv[7]);
  size_t nq=(size_t)n*H*d,nk=(size_t)n*KV*d,i; uint16_t*q=malloc(nq*2),*k=malloc(nk*2);
  srand(1); for(i=0;i<nq;i++){float f=(rand()/(float)RAND_MAX-0.5f)*2; uint32_t u; memcpy(&u,&f,4); q[i]=u>>16;}
  for(i=0;i<nk;i++){float f=(rand()/(float)RAND_MAX-0.5f)*2; uint32_t u; memcpy(&u,&f,4); k[i]=u>>16;}
  ei_config c=ei_config_quality(); c.rank_samples=R; c.rank_precision=prec; if(argc>9) c.simd=(ei_simd)atoi(argv[9]);
  ei_context*ctx; if(ei_context_create(&c,&ctx)) return 1;
  if(argc>10) ctx->i8dot=atoi(argv[10]);
  ei_tensor tq=ei_tensor_make(q,EI_BF16,n,H,d),tk=ei_tensor_make(k,EI_BF16,n,KV,d);
  ei_plan p; ei_plan_init(ctx,&p,n,KV,d,0,NULL,0);
  ei_shape sh; memset(&sh,0,sizeof sh); 
  size_t wb=0; ei_sizes sz; sh.max_tokens=n; sh.n_heads=H; sh.n_kv_heads=KV; sh.head_dim=d; sh.n_threads=atoi(argv[8]);
  if (ei_layer_sizes(ctx,&sh,&sz)) {printf("%s\n",ei_last_error());return 1;} wb=sz.profile;
  void*ws=malloc(wb); ei_exec x; memset(&x,0,sizeof x); x.n_threads=atoi(argv[8]); x.workspace=ws; x.workspace_bytes=wb;
  double best=1e9; int r;
  for(r=0;r<reps;r++){double t=now(); if(ei_profile(ctx,&x,&tq,&tk,&p)){printf("%s\n",ei_last_error());return 1;} t=now()-t; if(t<best)best=t;}
  printf("n %d H %d/%d d %d prec %d R %d: best %.2f ms (%s, i8dot %d)\n",n,H,KV,d,prec,R,best*1e3,ei_simd_name(ei_context_config(ctx)->simd),ctx->i8dot);
  return 0;}
