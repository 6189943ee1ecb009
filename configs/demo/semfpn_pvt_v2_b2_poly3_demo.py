# CPU demo of configs/semfpn_pvt_v2_b2_poly3.py on the embedded ADE20K-style digits data: only data root, image
# scale (crop 128) and schedule change (see _seg_demo_data.py). 1 process (CPU) x 4 images.
_base_ = ['../semfpn_pvt_v2_b2_poly3.py', './_seg_demo_data.py']
